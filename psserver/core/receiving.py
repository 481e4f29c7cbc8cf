"""Receiving pushes: the pending push, its receive buffer, decoding, and stall cancellation.

``PushReceiver.open`` hands out a ``PendingPush`` for a header the shard validated; the
transport feeds it the chunks (``PendingPush.add``), each decoded by psproto.codec straight
into the push's receive buffer, taken from a bounded pool at the first chunk. The push is then
committed by the shard (``Shard.commit_push``) or discarded, which gives the buffer back.

A push that holds a buffer and sends nothing for ``receive_idle_seconds`` is cancelled by
``cancel_stalled`` (the transport's ``cancel`` ends its stream) and is never applied. None of
this takes the shard lock: the receiver has its own small lock over the pushes it watches.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from psproto import codec
from psserver.core.buffers import ReceiveBuffers
from psserver.core.config import ShardConfig
from psserver.core.errors import ErrorKind, ShardError
from psserver.core.refusals import Refusals
from psserver.core.rules import PayloadKind
from psserver.core.workers import PushOutcome, WorkerRecord

_LOGGER = logging.getLogger(__name__)

# What a codec refusal means to a client; anything else is a wrong length.
_CODEC_REFUSALS = {
    "unknown_dtype": ErrorKind.UNKNOWN_DTYPE,
    "chunk_out_of_range": ErrorKind.CHUNK_OUT_OF_RANGE,
    "bad_chunk_size": ErrorKind.BAD_REQUEST,
}


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


@dataclass(eq=False)  # identity: the receiver tracks the pushes holding receive buffers
class PendingPush:
    """A push whose header passed validation, receiving its chunks.

    A retried push id comes back with ``replay`` set and its chunks are ignored. ``cancel``
    (from the transport) ends the push's stream if it stalls while holding its buffer.
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
    # The holder of a GEM reservation never queues for a buffer behind pushes that wait for it.
    bypass_buffer_limit: bool = False
    cancel: Callable[[], object] | None = None
    assembler: codec.Assembler | None = None
    bytes_received: int = 0
    last_chunk_at: float = 0.0
    # Set (under the receiver's lock) when the push was cancelled as stalled: never applied then.
    cancelled: bool = False

    def add(self, chunk: codec.ChunkLike) -> None:
        """Decode one chunk into the receive buffer (taken at the first chunk); a replay ignores it."""
        self.bytes_received += len(chunk.data)
        self.last_chunk_at = self.receiver.now()
        if self.replay is None:
            decode_into(self.decoder(), chunk, self.receiver.refusals, self.worker)

    def decoder(self) -> codec.Assembler:
        """The push's assembler, over a receive buffer taken now if it has none yet."""
        if self.assembler is None:
            self.assembler = self.receiver.take_buffer(self)
        return self.assembler


class PushReceiver:
    def __init__(self, refusals: Refusals, now: Callable[[], float], config: ShardConfig) -> None:
        self.refusals = refusals
        self.now = now
        self._limit = config.receive_buffers
        self._wait_seconds = config.receive_wait_seconds
        self._idle_seconds = config.receive_idle_seconds
        self.buffers = ReceiveBuffers(0, config.receive_buffers)
        # Pushes holding a receive buffer while their chunks arrive (for ``cancel_stalled``).
        self._receiving: set[PendingPush] = set()
        self._lock = threading.Lock()

    def open(
        self,
        worker: WorkerRecord,
        push_id: int,
        base_clock: int,
        kind: PayloadKind,
        metadata: dict[str, float],
        length: int,
        replay: PushOutcome | None,
        bypass_buffer_limit: bool,
        cancel: Callable[[], object] | None,
    ) -> PendingPush:
        """A pending push of ``length`` elements (caller holds the shard lock: the length is the shard's)."""
        if self.buffers.length != length:
            self.buffers = ReceiveBuffers(length, self._limit)
        return PendingPush(
            worker, push_id, base_clock, kind, metadata, self, self.buffers, replay, bypass_buffer_limit, cancel
        )

    def take_buffer(self, pending: PendingPush) -> codec.Assembler:
        """An assembler over a receive buffer for ``pending``; refused when none came free in time."""
        try:
            buffer = self.buffers.acquire(self._wait_seconds, bypass_limit=pending.bypass_buffer_limit)
        except TimeoutError:
            self.refusals.refuse(
                ErrorKind.LIMIT_REACHED,
                f"no receive buffer came free within {self._wait_seconds:.0f} s: "
                f"{self.buffers.limit} pushes are being received (--receive-buffers); retry, or raise it",
                pending.worker,
            )
        pending.last_chunk_at = self.now()
        with self._lock:
            self._receiving.add(pending)
        return codec.Assembler(buffer)

    def stalled(self, pending: PendingPush) -> ShardError | None:
        """Stop watching ``pending`` (its stream ended); the refusal to answer if it was cancelled as stalled."""
        with self._lock:
            self._receiving.discard(pending)
        if not pending.cancelled:
            return None
        message = (
            f"the push held a receive buffer and sent nothing for {self._idle_seconds:g} s "
            "(--receive-idle-seconds), so it was cancelled and not applied; retry it"
        )
        return ShardError(ErrorKind.PUSH_STALLED, message, counted=True)

    def cancel_stalled(self) -> list[PendingPush]:
        """Cancel every push holding a buffer that sent nothing for ``receive_idle_seconds``; returns them."""
        deadline = self.now() - self._idle_seconds
        with self._lock:
            stalled = [p for p in self._receiving if p.last_chunk_at < deadline]
            self._receiving.difference_update(stalled)
            for pending in stalled:
                pending.cancelled = True
        for pending in stalled:
            _LOGGER.warning(
                "cancelled a push of worker %s (%s): it held a receive buffer and sent nothing for %.0f s",
                pending.worker.worker_id,
                pending.worker.name,
                self._idle_seconds,
            )
            self.refusals.count(ErrorKind.PUSH_STALLED.reason, pending.worker)
            if pending.cancel is not None:
                pending.cancel()
        return stalled

    def discard(self, pending: PendingPush) -> None:
        """Give back a push's receive buffer; safe to call more than once, and after a commit."""
        with self._lock:
            self._receiving.discard(pending)
        if pending.assembler is not None:
            pending.buffers.release(pending.assembler.out)
            pending.assembler = None
