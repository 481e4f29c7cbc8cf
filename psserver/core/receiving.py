"""Receiving pushes: the pending push, its receive buffer, decoding, and ending pushes that hold
shared resources too long.

A push's header reaches the core as a ``PushHeader`` (plain data: the transport parsed it).
``PushReceiver.open`` hands out a ``PendingPush`` for a header the shard validated; the shard
(``Shard.push``) feeds it the chunks (``PendingPush.add``), each decoded by psproto.codec
straight into the push's receive buffer, taken from a bounded pool at the first chunk (one per
worker at a time). The push is then committed by the shard or discarded, which gives the
buffer back.

The receiver watches every open push until its stream ends (``cancel_stalled``, called by the
server's reaper), and ends one that holds the shard's resources longer than an honest client
needs. It is never applied then; its worker gets PUSH_STALLED (CANCELLED) and retries it:

- idle: sent nothing for ``receive_idle_seconds``, from its header or its last chunk: its
  stream is cancelled (the transport's ``cancel``), freeing the server thread it holds;
- too slow: fell behind ``transfer_pace`` (psserver.core.pace) while holding a receive buffer: the
  buffer is given back at once, and its next chunk is refused with the reason (a client that
  sends none is cancelled as idle).

A worker whose push was ended for its pace sits out ``SIT_OUT_GRACES`` × the pace's grace: its pushes
meanwhile are refused at their header (PUSH_STALLED, retried by the client), so a client that
trickles push after push holds a buffer about a ninth of the time, not all of it. A worker
has at most ``MAX_OPEN_PUSHES_PER_WORKER`` pushes receiving at once, so one worker cannot hold
every server thread, and with ``max_receiving_pushes`` the shard at most that many (each open
stream holds the transport's buffers while it waits for a receive buffer); a push over either is
refused at its header with a limit its client retries. None of this takes the shard lock: the receiver has its own
small lock over the pushes it watches, and each push a lock over its buffer.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from psproto import codec
from psproto.reasons import TransientLimit
from psserver.core.buffers import BufferWaitTimeoutError, ReceiveBuffers
from psserver.core.config import ShardConfig
from psserver.core.errors import ErrorKind, ShardError
from psserver.core.refusals import Refusals
from psserver.core.rules import PayloadKind
from psserver.core.stream_watch import StreamWatch
from psserver.core.waiting import Steps, run_blocking
from psserver.core.workers import PushOutcome, WorkerRecord

_LOGGER = logging.getLogger(__name__)

# Pushes of one worker receiving at once (one into its buffer, one retry waiting behind it).
MAX_OPEN_PUSHES_PER_WORKER = 2
# A worker whose push was ended waits this many graces before its next push is received.
SIT_OUT_GRACES = 8.0

# What a codec refusal means to a client; anything else is a wrong length.
_CODEC_REFUSALS = {
    "unknown_dtype": ErrorKind.UNKNOWN_DTYPE,
    "chunk_out_of_range": ErrorKind.CHUNK_OUT_OF_RANGE,
    "bad_chunk_size": ErrorKind.BAD_REQUEST,
    # The 8-bit block codec: a scale count that does not fit the values or a negative scale, a
    # NaN or Inf scale (what a diverged worker's push carries), or int8 where only floats go (Init).
    "bad_scales": ErrorKind.BAD_REQUEST,
    "non_finite_scale": ErrorKind.NON_FINITE,
    "push_only_dtype": ErrorKind.BAD_REQUEST,
}


class Limit(str, enum.Enum):
    """Which limit ended a push (the ``limit`` of its refusal's ErrorInfo metadata)."""

    IDLE = "receive_idle_seconds"
    PACE = "min_transfer_rate"


def decode_into(
    assembler: codec.Assembler, chunk: codec.ChunkLike, refusals: Refusals, worker: WorkerRecord | None = None
) -> None:
    """Decode one chunk into ``assembler``'s buffer; a bad chunk is refused."""
    try:
        assembler.add(chunk)
    except codec.CodecError as error:
        refusals.refuse(_CODEC_REFUSALS.get(error.reason, ErrorKind.WRONG_LENGTH), str(error), worker)


def check_complete(assembler: codec.Assembler, refusals: Refusals, worker: WorkerRecord | None = None) -> None:
    """Refuse an upload whose chunks did not cover the buffer exactly, or that holds NaN or Inf."""
    try:
        assembler.finish()
    except codec.CodecError as error:
        refusals.refuse(ErrorKind.WRONG_LENGTH, str(error), worker)
    if not assembler.all_finite():
        bad = assembler.count_non_finite()
        refusals.refuse(ErrorKind.NON_FINITE, f"{bad} element(s) are NaN or Inf; nothing was applied", worker)


@dataclass(frozen=True)
class PushHeader:
    """What a push says before its chunks, as the transport parsed it."""

    worker_id: int
    push_id: int
    # The clock of the parameters the update was computed on (its staleness is the shard's clock minus it).
    base_clock: int
    kind: int = int(PayloadKind.GRADIENT)
    layout_hash: str = ""
    metadata: Mapping[str, float] = field(default_factory=dict)
    # A PushPull's: the wire dtype of the parameters sent back after it (None: a plain push).
    pull_dtype: int | None = None


@dataclass(eq=False)  # identity: the receiver tracks the pushes it watches
class PendingPush:
    """A push whose header passed validation, receiving its chunks.

    A retried push id comes back with ``replay`` set and its chunks are ignored. ``cancel``
    (from the transport) ends the push's stream if it goes idle; ``abandoned`` (from the
    transport too) says its client gave up, which ends the push's waits in the shard
    (``psserver.core.waiting``: a push abandoned before its turn is not applied).
    """

    worker: WorkerRecord
    push_id: int
    base_clock: int
    kind: PayloadKind
    metadata: dict[str, float]
    receiver: PushReceiver
    # The pool the push's buffer comes from and goes back to.
    buffers: ReceiveBuffers
    replay: PushOutcome | None = None
    # A push others wait on (its rule's ``push_has_priority``) never queues for a buffer behind them.
    bypass_buffer_limit: bool = False
    cancel: Callable[[], object] | None = None
    abandoned: Callable[[], bool] | None = None
    assembler: codec.Assembler | None = None
    bytes_received: int = 0
    # When the header or the last chunk arrived (the idle limit counts from it).
    last_chunk_at: float = 0.0
    # When the header arrived: the worker's local steps ended then (its pace, ``local_steps``).
    opened_at: float = 0.0
    # When the push began to hold a receive buffer (a replay: its first chunk); the pace counts from it.
    receiving_since: float | None = None
    # Waiting for a receive buffer: the server's wait, not the client's, so not watched meanwhile.
    waiting: bool = False
    # Set (under the receiver's lock) when a limit ended the push: never applied then.
    ended: Limit | None = None
    # Set (under the receiver's lock) when its stream was cancelled.
    cancelled: bool = False
    # Held while a chunk is decoded into the buffer, and while the receiver takes the buffer back.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, chunk: codec.ChunkLike) -> None:
        """Decode one chunk into the receive buffer (taken at the first chunk); a replay ignores it."""
        receiver = self.receiver
        # Checked here first, so that a push no limit ended (every chunk of nearly every push)
        # makes no call for it.
        if self.ended is not None:
            receiver.refuse_if_ended(self)
        self.bytes_received += len(chunk.data) + len(chunk.scales)
        receiver.arrived(self)
        if self.replay is not None:
            return
        if self.assembler is None:
            receiver.take_buffer(self)
        with self.lock:
            if self.ended is not None:
                receiver.refuse_if_ended(self)
            assert self.assembler is not None
            decode_into(self.assembler, chunk, receiver.refusals, self.worker)

    def decoder(self) -> codec.Assembler:
        """The push's assembler, over a receive buffer taken now if it has none yet."""
        if self.assembler is None:
            self.receiver.take_buffer(self)
        assert self.assembler is not None
        return self.assembler


class PushReceiver:
    def __init__(self, refusals: Refusals, now: Callable[[], float], config: ShardConfig) -> None:
        self.refusals = refusals
        self.now = now
        self._limit = config.receive_buffers
        self._max_open = config.max_receiving_pushes
        self._wait_seconds = config.receive_wait_seconds
        self._idle_seconds = config.receive_idle_seconds
        self.pace = config.transfer_pace
        self.buffers = ReceiveBuffers(0, config.receive_buffers)
        # Init uploads and pull replies, held to the same limits (``cancel_stalled`` checks them too).
        self.streams = StreamWatch(refusals, now, config.receive_idle_seconds, config.transfer_pace)
        # Pushes from their header to the end of their stream (for ``cancel_stalled``).
        self._open: set[PendingPush] = set()
        self._open_by_worker: Counter[str] = Counter()
        # Worker name -> when it may push again, after a limit ended one of its pushes.
        self._sitting_out: dict[str, float] = {}
        self._lock = threading.Lock()

    def open(
        self,
        worker: WorkerRecord,
        header: PushHeader,
        length: int,
        replay: PushOutcome | None,
        bypass_buffer_limit: bool,
        cancel: Callable[[], object] | None,
        abandoned: Callable[[], bool] | None = None,
    ) -> PendingPush:
        """A pending push of ``length`` elements (caller holds the shard lock: the length is the shard's).

        Refused (LIMIT_REACHED) when the worker already has ``MAX_OPEN_PUSHES_PER_WORKER`` receiving."""
        if self.buffers.length != length:
            self.buffers = ReceiveBuffers(length, self._limit)
        pending = PendingPush(
            worker, header.push_id, header.base_clock, PayloadKind(header.kind), dict(header.metadata), self,
            self.buffers, replay, bypass_buffer_limit, cancel, abandoned,
        )  # fmt: skip
        now = pending.last_chunk_at = pending.opened_at = self.now()
        with self._lock:
            back_at = self._sitting_out.get(worker.name, now)
            if back_at <= now:
                self._sitting_out.pop(worker.name, None)
            crowded = self._open_by_worker[worker.name] >= MAX_OPEN_PUSHES_PER_WORKER
            # A push others wait on is never turned away.
            full = 0 < self._max_open <= len(self._open) and not bypass_buffer_limit
            if not crowded and not full and back_at <= now:
                self._open.add(pending)
                self._open_by_worker[worker.name] += 1
        if back_at > now:
            self.refusals.count(ErrorKind.PUSH_STALLED.reason, worker)
            raise ShardError(
                ErrorKind.PUSH_STALLED,
                f"a push of worker {worker.name} was ended for holding a receive buffer too long, so its pushes are "
                f"not received for {SIT_OUT_GRACES:g} × shard.transfer_pace.grace_s; retry in {back_at - now:.1f} s",
                counted=True,
                metadata={"limit": "sit_out", "retry_after_s": f"{back_at - now:.3f}"},
            )
        if full and not crowded:
            self.refusals.refuse(
                ErrorKind.LIMIT_REACHED,
                f"{self._max_open} pushes are being received by this shard "
                "(shard.max_receiving_pushes in the server's --config file); "
                "send this one again shortly",
                worker,
                {"limit": TransientLimit.RECEIVING_PUSHES.value},
            )
        if crowded:
            self.refusals.refuse(
                ErrorKind.LIMIT_REACHED,
                f"worker {worker.name} already has {MAX_OPEN_PUSHES_PER_WORKER} pushes being received by this "
                "shard; send one push at a time to each shard",
                worker,
                {"limit": TransientLimit.OPEN_PUSHES_PER_WORKER.value},
            )
        return pending

    def arrived(self, pending: PendingPush) -> None:
        """A chunk of ``pending`` arrived: its idle time starts again (a replay's pace starts now)."""
        pending.last_chunk_at = self.now()
        if pending.replay is not None and pending.receiving_since is None:
            pending.receiving_since = pending.last_chunk_at

    def take_buffer(self, pending: PendingPush) -> None:
        """``take_buffer_steps`` waited out on this thread."""
        run_blocking(self.take_buffer_steps(pending))

    def take_buffer_steps(self, pending: PendingPush) -> Steps[None]:
        """Give ``pending`` an assembler over a receive buffer (none when it has one, or is a replay);
        refused when none came free in time."""
        if pending.assembler is not None or pending.replay is not None:
            return
        self.refuse_if_ended(pending)
        with self._lock:
            pending.waiting = True
        # The wait is the server's: its worker stays alive meanwhile, as in the shard's waits.
        worker_was_waiting, pending.worker.waiting = pending.worker.waiting, True
        try:
            buffer = yield from pending.buffers.acquire_steps(
                self._wait_seconds, bypass_limit=pending.bypass_buffer_limit, owner=pending.worker.name
            )
        except BufferWaitTimeoutError as error:
            self.refusals.refuse(
                ErrorKind.LIMIT_REACHED,
                self._no_buffer_message(pending, error),
                pending.worker,
                {"limit": TransientLimit.RECEIVE_BUFFERS.value},
            )
        finally:
            pending.worker.waiting = worker_was_waiting
            with self._lock:
                pending.waiting = False
                pending.last_chunk_at = self.now()
        with pending.lock:
            pending.assembler = codec.Assembler(buffer, accept_blocks=True)
        with self._lock:
            pending.receiving_since = pending.last_chunk_at

    def _no_buffer_message(self, pending: PendingPush, error: BufferWaitTimeoutError) -> str:
        if error.own_share:
            return (
                f"no receive buffer came free within {self._wait_seconds:.0f} s: another push of worker "
                f"{pending.worker.name} holds one, and a worker's pushes to a shard are received one at a time"
            )
        return (
            f"no receive buffer came free within {self._wait_seconds:.0f} s: "
            f"{self.buffers.limit} pushes are being received "
            "(shard.receive_buffers in the server's --config file); retry, or raise it"
        )

    def refuse_if_ended(self, pending: PendingPush) -> None:
        """Refuse (PUSH_STALLED, counted when it was ended) a push a limit has ended."""
        if pending.ended is not None:
            raise self._ended_error(pending.ended)

    def _ended_error(self, limit: Limit) -> ShardError:
        if limit is Limit.IDLE:
            message = (
                f"the push sent nothing for {self._idle_seconds:g} s (shard.receive_idle_seconds), so it was "
                "cancelled and not applied; retry it"
            )
        else:
            message = (
                f"the push held a receive buffer but sent its bytes slower than {self.pace.describe()} "
                "(shard.transfer_pace in the server's --config file), so it was ended and not applied; retry it"
            )
        return ShardError(ErrorKind.PUSH_STALLED, message, counted=True, metadata={"limit": limit.value})

    def stalled(self, pending: PendingPush) -> ShardError | None:
        """Stop watching ``pending`` (its stream ended); the refusal to answer if a limit ended it."""
        self._forget(pending)
        return None if pending.ended is None else self._ended_error(pending.ended)

    def _forget(self, pending: PendingPush) -> None:
        with self._lock:
            if pending in self._open:
                self._open.discard(pending)
                self._open_by_worker[pending.worker.name] -= 1
                if not self._open_by_worker[pending.worker.name]:
                    del self._open_by_worker[pending.worker.name]

    def cancel_stalled(self) -> list[PendingPush]:
        """End every push past a limit (see the module's docstring), and cancel the Init and pull
        streams past one (``self.streams``); returns the pushes ended or cancelled now."""
        self.streams.cancel_slow()
        now = self.now()
        with self._lock:
            for name in [name for name, back_at in self._sitting_out.items() if back_at <= now]:
                del self._sitting_out[name]
            newly_ended, to_cancel = self._past_limits(now)
            self._sit_out(newly_ended, now)
        for pending in newly_ended:
            self._give_back(pending)
            self._log_ended(pending, now)
            self.refusals.count(ErrorKind.PUSH_STALLED.reason, pending.worker)
        for pending in to_cancel:
            if pending.cancel is not None:
                pending.cancel()
        return list(dict.fromkeys(newly_ended + to_cancel))

    def _past_limits(self, now: float) -> tuple[list[PendingPush], list[PendingPush]]:
        """Mark the open pushes past a limit now (under ``self._lock``): those that end now, and
        the idle ones whose streams to cancel (an idle push already ended by the pace is in both)."""
        newly_ended: list[PendingPush] = []
        to_cancel: list[PendingPush] = []
        for pending in self._open:
            if pending.waiting or pending.cancelled:
                continue
            if now - pending.last_chunk_at > self._idle_seconds:
                pending.cancelled = True
                to_cancel.append(pending)
                if pending.ended is None:
                    pending.ended = Limit.IDLE
                    newly_ended.append(pending)
            elif (
                pending.ended is None
                and pending.receiving_since is not None
                and self.pace.behind(pending.bytes_received, now - pending.receiving_since)
            ):
                pending.ended = Limit.PACE
                newly_ended.append(pending)
        return newly_ended, to_cancel

    def _sit_out(self, newly_ended: list[PendingPush], now: float) -> None:
        """Sit out the workers of the pushes ended by the pace (under ``self._lock``)."""
        sit_out_s = SIT_OUT_GRACES * self.pace.grace_s
        if sit_out_s <= 0:
            return
        for pending in newly_ended:
            # Only a push that held a buffer sits its worker out (one ended idle before its
            # first chunk held none; one holding a buffer falls behind the pace first).
            if pending.ended is Limit.PACE:
                self._sitting_out[pending.worker.name] = now + sit_out_s

    def _log_ended(self, pending: PendingPush, now: float) -> None:
        worker = pending.worker
        if pending.ended is Limit.IDLE:
            _LOGGER.warning(
                "cancelled a push of worker %s (%s): it sent nothing for %.0f s (shard.receive_idle_seconds)",
                worker.worker_id,
                worker.name,
                self._idle_seconds,
            )
            return
        held = now - (pending.receiving_since or now)
        _LOGGER.warning(
            "ended a push of worker %s (%s): %d bytes in %.1f s holding a receive buffer, slower than %s "
            "(shard.transfer_pace); its buffer is free again",
            worker.worker_id,
            worker.name,
            pending.bytes_received,
            held,
            self.pace.describe(),
        )

    def _give_back(self, pending: PendingPush) -> None:
        with pending.lock:
            if pending.assembler is not None:
                pending.buffers.release(pending.assembler.out, pending.worker.name)
                pending.assembler = None

    def discard(self, pending: PendingPush) -> None:
        """Give back a push's receive buffer; safe to call more than once, and after a commit."""
        self._forget(pending)
        self._give_back(pending)
