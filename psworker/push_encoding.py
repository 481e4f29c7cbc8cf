"""What a push sends to each shard: its slice as chunks of the push dtype, with 8-bit error feedback.

With the 8-bit block codec (``codec.INT8_BLOCK``) and error feedback on (the default), each
shard slice keeps a residual ``e`` on the worker, never sent (ALGORITHMS.md, "8-bit block codec
for pushes"): it starts at 0; to push ``p`` the worker sends ``Q(p + e)`` and sets
``e ← (p + e) − x̂``, so the sum of what the server decodes trails the sum of the true pushes
by ``e`` alone. A push is encoded once, whatever its retries: a retried push id resends the same
bytes, and the residual moves once. The residual is dropped (back to 0) when the worker joins a
shard again, as the server may have lost what it had applied; and it is not moved by a push
whose scales are NaN or Inf (the server refuses it, NON_FINITE), so one bad step does not poison
the next. Float dtypes are encoded lazily chunk by chunk as before (they are exact to resend).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import torch

from psproto import blocks, codec
from psproto.layout import ShardRange


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
    """One push of ``flat``: each shard's chunks, encoded at its first attempt, the same bytes for its retries."""

    def __init__(self, encoder: PushEncoder, flat: torch.Tensor) -> None:
        self._encoder = encoder
        self._flat = flat
        self._encoded: dict[int, list[codec.ChunkPayload]] = {}

    def chunks(self, shard: ShardRange) -> Iterable[codec.ChunkPayload]:
        part = self._flat[shard.offset : shard.end]
        if self._encoder.dtype != codec.INT8_BLOCK:
            return self._encoder.chunks(shard.index, part)  # lazy, and exact to make again
        if shard.index not in self._encoded:
            self._encoded[shard.index] = list(self._encoder.chunks(shard.index, part))
        return self._encoded[shard.index]


class PushEncoder:
    """Turns a shard's slice of an update into the chunks a push sends."""

    def __init__(self, dtype: codec.DTypeValue, error_feedback: bool = True) -> None:
        self.dtype = dtype
        self.error_feedback = error_feedback and dtype == codec.INT8_BLOCK
        self._residuals: dict[int, torch.Tensor] = {}
        self._lock = threading.Lock()

    def residual(self, shard: int) -> torch.Tensor | None:
        """Shard ``shard``'s residual ``e`` (None: zero, nothing pushed since the last reset)."""
        return self._residuals.get(shard)

    def one_push(self, flat: torch.Tensor) -> OnePush:
        """What one push of ``flat`` (all its shards, all its attempts) sends."""
        return OnePush(self, flat)

    def reset(self, shard: int) -> None:
        """Drop shard ``shard``'s residual (the worker joined it again)."""
        with self._lock:
            self._residuals.pop(shard, None)

    def chunks(self, shard: int, part: torch.Tensor) -> Iterable[codec.ChunkPayload]:
        """The chunks of ``part`` (shard ``shard``'s slice of the update). For INT8_BLOCK a list,
        made now (the residual moves now); for a float dtype a lazy iterator over ``part``."""
        if self.dtype != codec.INT8_BLOCK:
            return codec.payloads(part, self.dtype)
        if not self.error_feedback:
            return list(codec.payloads(part, self.dtype))
        with self._lock:
            residual = self._residuals.get(shard)
        # One compiled pass per block makes v = p + e, its blocks and the new residual v − x̂, in
        # a new buffer: the old one stays until this push is known to be finite.
        values, scales, updated = blocks.encode_with_feedback(part, residual)
        chunks = [
            codec.block_payload(
                span.start,
                values[span.start : span.stop],
                scales[span.start // blocks.BLOCK : blocks.block_count(span.stop)],
            )
            for span in codec.chunk_spans(part.numel(), self.dtype)
        ]
        if bool(torch.isfinite(scales).all()):
            with self._lock:
                self._residuals[shard] = updated
        return chunks
