"""A pulled version's reply messages, serialised chunk by chunk as the transport sends them.

Serialising a whole ResNet-18-sized version (45 MB) before its first byte leaves adds the copy's
time to every step; building each message only when the transport asks for it overlaps the
copies with the sending. The bytes of each message come from a ``PullEncoder`` that the
transport injects (psserver.rpc): the core never knows the wire format.

Contract with the owner of the source: the source may be read here until ``complete``; whoever
changes it must call ``freeze`` first (``PullVersions.freeze_before_update`` does, under the
shard lock, before every update). ``freeze`` builds the messages not built yet, so every reader
still gets exactly the version it pulled. A private lock orders a reader's build of one message
against ``freeze``; it never waits on the shard lock.

A version of the live parameters may also be built ahead (``builder``, ``--build-replies-ahead``):
when its first reader starts, a builder thread builds its messages in order, at most
``AHEAD_MESSAGES`` past the furthest reader, while the reader's thread hands earlier ones to the
transport and waits for each to be taken. The reader then finds its next message built; where
the builder is behind, the reader builds it itself, as without one. The copies (and an update
applied during the reply, ``before_read``) leave the sending thread's path; they release the GIL
(torch's conversions, ``bytes.join`` of a large buffer), so the two threads overlap. A builder
whose reader stops taking messages for ``READER_QUIET_SECONDS``, or whose shard closes
(``stop_building``), leaves the rest to the readers.

A version read from a private source that nobody changes (``retain=False``: a snapshot the rule
keeps anyway) keeps no messages: each reader's message is built when it asks and belongs to it
alone, so such a version holds no more than its source (which the rule holds anyway) instead
of a second copy of the shard in reply bytes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future
from typing import Protocol

import torch

from psproto import codec
from psproto.inline_ops import inline_torch_ops

# How far a builder runs ahead of the furthest reader: near enough that what it built is still in
# cache when the transport copies it (a whole shard built ahead is cold by then, and the copies cost more).
AHEAD_MESSAGES = 4
READER_QUIET_SECONDS = 1.0


_LOGGER = logging.getLogger(__name__)


def _log_failure(work: Future[None]) -> None:
    """A builder's failure (the rule's apply of a span, an encoder): its reader meets it too, when it
    builds that message itself; logged here so the builder's own is not lost."""
    error = None if work.cancelled() else work.exception()
    if error is not None:
        _LOGGER.error("building a reply ahead of its sending failed", exc_info=error)


class PullEncoder(Protocol):
    """Serialises one reply message carrying one chunk of a pulled version."""

    def encode(self, clock: int, total_length: int, chunk: codec.ChunkPayload) -> bytes: ...


class SerializedPull:
    """The messages of one version, built on first read and shared by every reader."""

    def __init__(
        self,
        source: torch.Tensor,
        clock: int,
        wire_dtype: int,
        spans: Sequence[range],
        encoder: PullEncoder,
        retain: bool = True,
        before_read: Callable[[int], None] | None = None,
        builder: Executor | None = None,
    ) -> None:
        if before_read is not None and not retain:
            raise ValueError("only a version of the live parameters reads them while an update is applied")
        if builder is not None and not retain:
            raise ValueError("only a version of the live parameters keeps messages built ahead")
        self._source: torch.Tensor | None = source
        # Brings the source's elements [0, stop) up to date before a message reads them (an update
        # applied span by span, ``psserver.core.span_apply``); None: the source is up to date.
        self._before_read = before_read
        self._chunker: codec.Chunker | None = codec.Chunker(source, wire_dtype)
        self._retain = retain
        self._clock = clock
        self._total = source.numel()
        self._spans = tuple(spans)
        self._encoder = encoder
        self._lock = threading.Lock()
        self._messages: list[bytes | None] = [None] * len(self._spans)
        self._unbuilt = len(self._spans)
        # Builds the messages ahead of the readers once the first one starts; None: readers build.
        self._builder = builder
        self._building = False
        # The furthest a reader has come (messages asked for), told to the builder as it moves.
        self._asked = 0
        self._reader_moved = threading.Condition()
        # Set by ``stop_building`` (the server stopping): a builder leaves at once, none starts.
        self._stopped = False

    def __len__(self) -> int:
        return len(self._spans)

    def __iter__(self) -> Iterator[bytes]:
        if not self._retain:
            yield from self._unretained()
            return
        self._start_builder()
        for index in range(len(self._spans)):
            if self._building:
                self._ask(index + 1)
            message = self._messages[index]
            if message is None:
                with self._lock:
                    message = self._message_locked(index)
            yield message

    def _start_builder(self) -> None:
        with self._lock:
            builder, self._builder = self._builder, None
            if builder is None or self._unbuilt == 0:
                return  # another reader started it, or nothing is left to build
            self._building = True
        try:
            work = builder.submit(self._build_ahead)
        except RuntimeError:  # the pool was shut down meanwhile (``PullVersions.close``): readers build
            self._building = False
            return
        work.add_done_callback(_log_failure)

    def _ask(self, count: int) -> None:
        with self._reader_moved:
            if count > self._asked:
                self._asked = count
                self._reader_moved.notify()

    def _build_ahead(self) -> None:
        """Build the messages not built yet, in order and ``AHEAD_MESSAGES`` past the furthest reader
        at most, taking the lock for one message at a time so a reader needing one never waits for
        more; leave as soon as every message is built (by anyone: ``freeze`` before an update)."""
        try:
            with inline_torch_ops():  # one span at a time: waking the intra-op pool costs more than it saves
                for index in range(len(self._spans)):
                    with self._reader_moved:
                        while self._unbuilt and index >= self._asked + AHEAD_MESSAGES and not self._stopped:
                            if not self._reader_moved.wait(READER_QUIET_SECONDS):
                                return  # the readers went quiet (a client gone, or slow): they build the rest
                    if self._unbuilt == 0 or self._stopped:
                        return
                    if self._messages[index] is None:
                        with self._lock:
                            self._message_locked(index)
        finally:
            self._building = False

    def stop_building(self) -> None:
        """No builder starts for this version any more, and a running one leaves after the message
        it is building: its readers build the rest, as without one."""
        with self._lock:
            self._builder = None
        with self._reader_moved:
            self._stopped = True
            self._reader_moved.notify_all()

    def _unretained(self) -> Iterator[bytes]:
        chunker = self._chunker
        assert chunker is not None
        for span in self._spans:
            yield self._encoder.encode(self._clock, self._total, chunker.payload(span))

    @property
    def retained_bytes(self) -> int:
        """Bytes of the messages this version keeps (built and shared by its readers)."""
        return sum(len(message) for message in self._messages if message is not None)

    def reads(self, tensor: torch.Tensor) -> bool:
        """Whether messages not built yet will be read from ``tensor``."""
        return self._source is tensor

    @property
    def complete(self) -> bool:
        """Every message is built: the source is no longer read (never, without ``retain``)."""
        return self._retain and self._unbuilt == 0

    def freeze(self) -> None:
        """Build every message not built yet, so the source may change."""
        if not self._retain:
            raise RuntimeError("a version of a private source keeps reading it: it must not change")
        with self._lock:
            for index in range(len(self._spans)):
                self._message_locked(index)

    def _message_locked(self, index: int) -> bytes:
        message = self._messages[index]
        if message is None:
            assert self._chunker is not None
            span = self._spans[index]
            if self._before_read is not None:
                self._before_read(span.stop)
            message = self._encoder.encode(self._clock, self._total, self._chunker.payload(span))
            self._messages[index] = message
            self._unbuilt -= 1
            if self._unbuilt == 0:
                with self._reader_moved:
                    self._reader_moved.notify_all()  # a builder waiting for its reader has nothing left
                # The messages are the copy now: nothing here keeps the source (or its update) alive.
                self._source = self._chunker = self._before_read = None
        return message
