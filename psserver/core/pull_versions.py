"""The parameter versions handed to pulls: made once per clock, dtype and form, and shared.

A version comes in the in-process form (chunk payloads, ``PullResult.chunks``) or, when the
transport passes its ``PullEncoder``, as serialised reply messages (``PullResult.messages``,
built lazily by ``SerializedPull``). Versions of the current clock are cached; a serialised
version stays *in flight* while a reply still holds it (the transport keeps the result until
sent), and at ``max_in_flight`` clocks in flight a pull may be given the newest of them.

Contract with the shard (which calls everything here under its lock, except ``encode`` of a
private copy): a serialised version may read the live parameters while it is sent, so the
shard calls ``freeze_before_update(params)`` before every change to them. That drops the cached
versions (about to go stale) and freezes every in-flight version still reading the parameters
(one copy of them in the wire dtype, made only while a reply still holds that version).

A copy of a large shard would be a third shard-sized buffer beside the parameters and the push
being applied. So an update of a shard whose version is larger than ``MAX_FROZEN_BYTES`` first
lets the replies reading the live parameters finish (``must_wait_for_replies``, at most
``REPLY_WAIT_S``; the shard holds new pulls meanwhile, ``updates_waiting``), and copies only what
is still held after that. ``released`` (the shard's condition) is notified when such a reply
lets go of its version, unless its lock is busy (its holder may be the thread letting go; the
waiting update then sees it within a wait slice).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from psproto import codec
from psserver.core.serialized_pull import PullEncoder, SerializedPull
from psserver.core.waiting import Signal, Steps

__all__ = ["PullEncoder", "PullResult", "PullVersions"]

_CacheKey = tuple[int, int, PullEncoder | None]

# Larger live versions are not copied at an update while their replies can finish first.
MAX_FROZEN_BYTES = 32 * 1024 * 1024
# How long an update waits for those replies before it copies what they still read.
REPLY_WAIT_S = 10.0


@dataclass(frozen=True, eq=False)  # identity: results are tracked while being sent
class PullResult:
    clock: int
    total_length: int
    # The in-process form fills ``chunks``; a serialised one (``encoder`` given) fills ``messages``.
    chunks: list[codec.ChunkPayload] = field(default_factory=list)
    messages: SerializedPull | tuple[bytes, ...] = ()
    data_bytes: int = 0
    wire_dtype: int = codec.FLOAT32
    encoder: PullEncoder | None = None


def _notify_if_free(signal: Signal) -> None:
    """Wake ``signal``'s waiters unless its lock is busy (see the module's docstring)."""
    if signal.lock.acquire(blocking=False):
        try:
            signal.notify_all()
        finally:
            signal.lock.release()


def _handed_out(result: PullResult | None) -> PullResult | None:
    """``result``, counted as handed to a pull that will read it."""
    if result is not None and isinstance(result.messages, SerializedPull):
        result.messages.hand_out()
    return result


class PullVersions:
    def __init__(self, chunk_bytes: int, max_in_flight: int, released: Signal | None = None) -> None:
        self._chunk_bytes = chunk_bytes
        self._max_in_flight = max_in_flight
        self._released = released
        # Updates waiting for the replies that read the live parameters: pulls wait for them.
        self.updates_waiting = 0
        # The parameters of the latest clock in each requested form, shared by every worker pulling it.
        self._cache: dict[_CacheKey, PullResult] = {}
        # Serialised versions still referenced (being sent); the transport holds each until sent.
        self._in_flight: weakref.WeakSet[PullResult] = weakref.WeakSet()

    def cached(self, clock: int, wire_dtype: int, encoder: PullEncoder | None) -> PullResult | None:
        """The version of ``clock`` in this form, if made; versions of older clocks are dropped."""
        self._cache = {k: v for k, v in self._cache.items() if k[0] == clock}
        return _handed_out(self._cache.get((clock, wire_dtype, encoder)))

    def newest_in_flight(
        self, wire_dtype: int, encoder: PullEncoder | None, share: bool, kept: Callable[[int], bool] | None
    ) -> PullResult | None:
        """The newest serialised version in this form being sent, when ``max_in_flight`` clocks are,
        sharing is allowed (``admission.may_share_version_in_flight``) and, for a rule that measures
        the gap, its snapshot is still ``kept``."""
        if encoder is None or not share:
            return None  # in-process pulls always see the latest clock
        live = [r for r in list(self._in_flight) if r.wire_dtype == wire_dtype and r.encoder is encoder]
        if len({r.clock for r in live}) < self._max_in_flight:
            return None
        newest = max(live, key=lambda r: r.clock)
        return _handed_out(newest) if kept is None or kept(newest.clock) else None

    def encode(
        self,
        source: torch.Tensor,
        clock: int,
        wire_dtype: int,
        encoder: PullEncoder | None,
        live: bool = False,
    ) -> PullResult:
        """``source`` in the form asked for. The in-process form's payloads are views of ``source``,
        so it must be a copy nobody changes; serialised messages are built as each reader reads,
        from the ``live`` parameters (frozen before an update) or from a private source."""
        total = source.numel()
        if encoder is None:
            payloads = list(codec.payloads(source, wire_dtype, self._chunk_bytes))
            data_bytes = sum(len(p.data) for p in payloads)
            return PullResult(clock, total, chunks=payloads, data_bytes=data_bytes, wire_dtype=wire_dtype)
        spans = codec.chunk_spans(total, wire_dtype, self._chunk_bytes)
        messages = SerializedPull(source, clock, wire_dtype, spans, encoder, live)
        data_bytes = total * codec.element_size(wire_dtype)
        return PullResult(
            clock, total, messages=messages, data_bytes=data_bytes, wire_dtype=wire_dtype, encoder=encoder
        )

    def begin(
        self,
        clock: int,
        wire_dtype: int,
        encoder: PullEncoder | None,
        params: torch.Tensor,
        snapshot: torch.Tensor | None,
    ) -> PullResult | torch.Tensor:
        """A new version of ``clock`` (lock held): made and kept now when serialised from the live
        ``params`` (its messages read them as they are sent, frozen before a change); otherwise the
        private source for the caller to ``encode`` outside the lock and then ``keep``: the
        ``snapshot`` a rule keeps anyway, or a copy (in-process payloads are views of it)."""
        if snapshot is not None:
            return snapshot
        if encoder is None:
            return params.clone()
        result = self.encode(params, clock, wire_dtype, encoder, live=True)
        self.keep(result, current=True)
        if self._released is not None and result.data_bytes > MAX_FROZEN_BYTES:
            weakref.finalize(result, _notify_if_free, self._released).atexit = False
        _handed_out(result)
        return result

    def keep(self, result: PullResult, current: bool) -> None:
        """Track ``result`` while it is sent, and cache it when its clock is still ``current``."""
        self._in_flight.add(result)
        if current:
            self._cache = {k: v for k, v in self._cache.items() if k[0] == result.clock}
            self._cache[(result.clock, result.wire_dtype, result.encoder)] = result

    def _reading(self, params: torch.Tensor) -> Iterator[SerializedPull]:
        """The versions in flight whose messages still read ``params``."""
        for result in list(self._in_flight):
            if isinstance(result.messages, SerializedPull) and result.messages.reads(params):
                yield result.messages

    def must_wait_for_replies(self, params: torch.Tensor) -> bool:
        """Whether an update of ``params`` should wait for replies before it changes them: a version
        larger than ``MAX_FROZEN_BYTES`` reads them. The cached versions are dropped first (no
        reply holds them; new pulls make new ones)."""
        self._cache = {}
        return any(messages.frozen_size > MAX_FROZEN_BYTES for messages in self._reading(params))

    def let_replies_finish(
        self,
        params: torch.Tensor,
        now: Callable[[], float],
        wait: Callable[[Callable[[], bool], float], Steps[None]],
    ) -> Steps[None]:
        """Before an update of ``params`` (lock held): when ``must_wait_for_replies``, ``wait`` (the
        shard's wait, which lets go of the lock) until those replies are done or ``REPLY_WAIT_S``
        passed, with ``updates_waiting`` raised so new pulls wait too."""
        if not self.must_wait_for_replies(params):
            return
        deadline = now() + REPLY_WAIT_S
        self.updates_waiting += 1
        try:
            yield from wait(lambda: now() >= deadline or not self.must_wait_for_replies(params), deadline)
        finally:
            self.updates_waiting -= 1

    def freeze_before_update(self, params: torch.Tensor) -> None:
        """Before ``params`` change: drop the cached versions first (a version no reply holds any
        more is then not copied for nothing), and freeze every one still reading ``params``."""
        self._cache = {}
        for messages in self._reading(params):
            messages.freeze()

    def clear(self) -> None:
        self._cache = {}
