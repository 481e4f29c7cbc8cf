"""What a push sends to each shard: its slice as chunks of the push dtype, with 8-bit error feedback.

With the 8-bit block codec (``codec.INT8_BLOCK``) and error feedback on (the default), each
shard slice keeps a residual ``e`` on the worker, never sent (ALGORITHMS.md, "8-bit block codec
for pushes"): it starts at 0; to push ``p`` the worker sends ``Q(p + e)`` and sets
``e ← (p + e) − x̂``, so the sum of what the server decodes trails the sum of the true pushes
by ``e`` alone. A push is encoded once, chunk by chunk as it is first sent, whatever its
retries: a retried push id resends the same bytes, and the residual moves once. The residual is
dropped (back to 0) when the worker joins a shard again, as the server may have lost what it
had applied; and it is not moved by a push whose scales are NaN or Inf (the server refuses it,
NON_FINITE), so one bad step does not poison the next. Float dtypes are encoded lazily chunk by
chunk too, and made again for a retry (they are exact to resend).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Iterator

import torch

from psproto import blocks, codec
from psproto.layout import ShardRange
from psworker.channels import MAX_MESSAGE_BYTES


def wire_dtypes(
    wire_dtype: str, push_dtype: str | None, pull_dtype: str | None
) -> tuple[codec.DTypeValue, codec.DTypeValue]:
    """(push, pull) wire dtypes from their names; ``wire_dtype`` is both unless the other says
    otherwise. A ValueError says what is wrong (int8 is for pushes only)."""
    push_name, pull_name = push_dtype or wire_dtype, pull_dtype or wire_dtype
    if pull_name not in codec.WIRE_DTYPE_NAMES:
        raise ValueError(codec.pull_dtype_problem(pull_name))
    if push_name not in codec.PUSH_DTYPE_NAMES:
        raise ValueError(f"push dtype {push_name!r} is not one of {', '.join(codec.PUSH_DTYPE_NAMES)}")
    return codec.PUSH_DTYPE_NAMES[push_name], codec.WIRE_DTYPE_NAMES[pull_name]


class OnePush:
    """One push of ``flat``: each shard's chunks, encoded as its first attempt sends them, the same
    bytes for its retries."""

    def __init__(self, encoder: PushEncoder, flat: torch.Tensor) -> None:
        self._encoder = encoder
        self._flat = flat
        self._encoded: dict[int, Iterable[codec.ChunkPayload]] = {}

    def chunks(self, shard: ShardRange) -> Iterable[codec.ChunkPayload]:
        part = self._flat[shard.offset : shard.end]
        if self._encoder.dtype != codec.INT8_BLOCK:
            return self._encoder.chunks(shard.index, part)  # lazy, and exact to make again
        if shard.index not in self._encoded:
            self._encoded[shard.index] = self._encoder.chunks(shard.index, part)
        return self._encoded[shard.index]


class BlockPush:
    """One shard's 8-bit chunks of one push, each encoded when it is first sent and kept for retries.

    Encoding chunk by chunk as the transport asks for them overlaps the encode with the sending
    (a whole ResNet-18-sized push is one pass over 47 MB, made before the first byte left when it
    was encoded at once). With error feedback, each chunk's new residual goes into a buffer of its
    own; it replaces the shard's residual when the last chunk is taken, and only if every scale
    is finite (a push the server will refuse leaves the residual as it was); a retry sends the
    chunks already made."""

    def __init__(self, encoder: PushEncoder, shard: int, part: torch.Tensor) -> None:
        self._encoder = encoder
        self._shard = shard
        self._part = part
        self._generation = encoder.generation(shard)
        self._residual = encoder.residual(shard) if encoder.error_feedback else None
        # Taken at the first chunk: a push given up before it sends anything leaves the spare buffer
        # to the next push, which would otherwise allocate (and fault in) a shard-sized one.
        self._updated: torch.Tensor | None = None
        self._spans = codec.chunk_spans(part.numel(), codec.INT8_BLOCK, encoder.chunk_bytes)
        self._encoded: list[codec.ChunkPayload] = []
        self._finite = True

    def __iter__(self) -> Iterator[codec.ChunkPayload]:
        for index in range(len(self._spans)):
            if index == len(self._encoded):
                self._encoded.append(self._take(index))
            yield self._encoded[index]

    def _take(self, index: int) -> codec.ChunkPayload:
        """Chunk ``index`` encoded, counted towards the residual's replacement."""
        if self._encoder.error_feedback and self._updated is None:
            self._updated = self._encoder.residual_buffer(self._shard, self._part.numel())
        payload, finite = self._encode(self._spans[index])
        self._finite = self._finite and finite
        if self._updated is not None and self._finite and index == len(self._spans) - 1:
            self._encoder.keep_residual(self._shard, self._updated, self._generation)
        return payload

    def _encode(self, span: range) -> tuple[codec.ChunkPayload, bool]:
        """One chunk's payload and whether its scales are finite; the new residual's span written."""
        piece = self._part[span.start : span.stop]
        if self._updated is None:
            values, scales = blocks.encode(piece)
        else:
            previous = None if self._residual is None else self._residual[span.start : span.stop]
            values, scales, _ = blocks.encode_with_feedback(piece, previous, self._updated[span.start : span.stop])
        return codec.block_payload(span.start, values, scales), bool(torch.isfinite(scales).all())


class DeviceBlockPush:
    """One shard's 8-bit chunks of one push of an update held on a GPU: the whole slice encoded on
    the device when the push is first sent (the residual ``e`` stays there), the values and scales
    copied to page-locked host memory, and cut into the same chunks a host encode would send."""

    def __init__(self, encoder: PushEncoder, shard: int, part: torch.Tensor) -> None:
        generation = encoder.generation(shard)
        updated = encoder.residual_buffer(shard, part.numel(), part.device) if encoder.error_feedback else None
        q, scales, _ = blocks.encode_tensors(part, encoder.residual(shard), updated, feedback=updated is not None)
        pin = part.device.type == "cuda"
        host_q = torch.empty(q.shape, dtype=q.dtype, pin_memory=pin)
        host_scales = torch.empty(scales.shape, dtype=scales.dtype, pin_memory=pin)
        host_q.copy_(q, non_blocking=pin)
        host_scales.copy_(scales, non_blocking=pin)
        if pin:
            torch.cuda.current_stream(part.device).synchronize()
        if updated is not None and bool(torch.isfinite(host_scales).all()):
            encoder.keep_residual(shard, updated, generation)
        spans = codec.chunk_spans(part.numel(), codec.INT8_BLOCK, encoder.chunk_bytes)
        # Chunks hold whole blocks, so a chunk's blocks are the slice's blocks from its offset on.
        self._chunks = [
            codec.block_payload(
                span.start,
                host_q[span.start : span.stop],
                host_scales[span.start // blocks.BLOCK : blocks.block_count(span.stop)],
            )
            for span in spans
        ]

    def __iter__(self) -> Iterator[codec.ChunkPayload]:
        return iter(self._chunks)


class PushEncoder:
    """Turns a shard's slice of an update into the chunks a push sends."""

    def __init__(
        self,
        dtype: codec.DTypeValue,
        error_feedback: bool = True,
        chunk_bytes: int = codec.DEFAULT_CHUNK_BYTES,
    ) -> None:
        problem = codec.chunk_bytes_problem(chunk_bytes, MAX_MESSAGE_BYTES)
        if problem is not None:
            raise ValueError(problem)
        self.dtype = dtype
        self.chunk_bytes = chunk_bytes
        self.error_feedback = error_feedback and dtype == codec.INT8_BLOCK
        self._residuals: dict[int, torch.Tensor] = {}
        # A residual that was replaced, kept to be written over by the next push's.
        self._spares: dict[int, torch.Tensor] = {}
        self._generations: Counter[int] = Counter()
        self._lock = threading.Lock()

    def residual(self, shard: int) -> torch.Tensor | None:
        """Shard ``shard``'s residual ``e`` (None: zero, nothing pushed since the last reset); its
        memory is written over by the push after next."""
        with self._lock:
            return self._residuals.get(shard)

    def generation(self, shard: int) -> int:
        """How many times shard ``shard``'s residual was reset: a push begun before a reset keeps its bytes
        for its retries but moves no residual."""
        with self._lock:
            return self._generations[shard]

    def keep_residual(self, shard: int, residual: torch.Tensor, generation: int) -> None:
        """``residual`` is shard ``shard``'s ``e`` from now on (a push of it was encoded, all finite,
        with no reset since it began: ``generation``); the one it replaces is no longer read and
        becomes the buffer of the next push's."""
        with self._lock:
            if generation != self._generations[shard]:
                return
            replaced = self._residuals.get(shard)
            self._residuals[shard] = residual
            if replaced is not None and replaced.numel() == residual.numel():
                self._spares[shard] = replaced

    def residual_buffer(self, shard: int, length: int, device: torch.device | None = None) -> torch.Tensor:
        """A buffer on ``device`` (default: the host) for shard ``shard``'s next residual, never the
        current one: the two alternate, so a push allocates (and faults in) no shard-sized tensor."""
        device = device or torch.device("cpu")
        with self._lock:
            spare = self._spares.pop(shard, None)
        if spare is not None and spare.numel() == length and spare.device == device:
            return spare
        return torch.empty(length, dtype=torch.float32, device=device)

    def one_push(self, flat: torch.Tensor) -> OnePush:
        """What one push of ``flat`` (all its shards, all its attempts) sends."""
        return OnePush(self, flat)

    def reset(self, shard: int) -> None:
        """Drop shard ``shard``'s residual (the worker joined it again)."""
        with self._lock:
            self._residuals.pop(shard, None)
            self._spares.pop(shard, None)
            self._generations[shard] += 1

    def chunks(self, shard: int, part: torch.Tensor) -> Iterable[codec.ChunkPayload]:
        """The chunks of ``part`` (shard ``shard``'s slice of the update), made as they are iterated:
        for INT8_BLOCK a :class:`BlockPush` (iterate it again for the same bytes; the residual moves
        when its last chunk is made), or a :class:`DeviceBlockPush` when ``part`` is on a GPU; for a
        float dtype an iterator over ``part``."""
        on_host = part.device.type == "cpu"
        if self.dtype != codec.INT8_BLOCK:
            if not on_host:
                part = part.to(device="cpu", dtype=codec.wire_dtype(self.dtype))
            return codec.payloads(part, self.dtype, self.chunk_bytes)
        return BlockPush(self, shard, part) if on_host else DeviceBlockPush(self, shard, part)
