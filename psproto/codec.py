"""Tensor encoding for the wire: flat fp32 tensors to and from dtype-tagged chunks.

This is the only place that knows how elements become bytes. Chunks are slices of a
flat vector, little-endian, at most ``DEFAULT_CHUNK_BYTES`` each, so no message nears
gRPC's size limits. Decoding writes straight into a caller-owned buffer.

Pushes may also travel as ``INT8_BLOCK`` (psproto.blocks: int8 values and one fp32 scale per
block of ``BLOCK`` values from the chunk's offset); Init and pulls never do, as the
authoritative parameters are never sent below 16 bits.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from psproto import blocks
from psproto.dtypes import (
    BFLOAT16,
    DEFAULT_CHUNK_BYTES,
    DEFAULT_MAX_MESSAGE_BYTES,
    FLOAT16,
    FLOAT32,
    INT8_BLOCK,
    MIN_CHUNK_BYTES,
    PUSH_DTYPE_NAMES,
    UNSPECIFIED,
    WIRE_DTYPE_NAMES,
    DTypeValue,
    chunk_bytes_problem,
    pull_dtype_problem,
)
from psproto.v1 import ps_pb2

# The names by dtype and the chunk bounds live in psproto.dtypes (no torch) and are re-exported here.
__all__ = [
    "BFLOAT16",
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "FLOAT16",
    "FLOAT32",
    "INT8_BLOCK",
    "MIN_CHUNK_BYTES",
    "PUSH_DTYPE_NAMES",
    "UNSPECIFIED",
    "WIRE_DTYPES",
    "WIRE_DTYPE_NAMES",
    "Assembler",
    "ChunkLike",
    "ChunkPayload",
    "Chunker",
    "CodecError",
    "DTypeValue",
    "block_payload",
    "chunk_bytes_problem",
    "chunk_spans",
    "element_size",
    "encode",
    "payload",
    "payloads",
    "pull_dtype_problem",
    "wire_bytes",
    "wire_dtype",
]

WIRE_DTYPES: dict[DTypeValue, torch.dtype] = {
    ps_pb2.DTYPE_FLOAT32: torch.float32,
    ps_pb2.DTYPE_BFLOAT16: torch.bfloat16,
    ps_pb2.DTYPE_FLOAT16: torch.float16,
}
# Decoding only reads from the message's immutable bytes, so torch's warning about
# non-writable buffers does not apply.
warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)

if sys.byteorder != "little":  # pragma: no cover - every supported platform is little-endian
    raise ImportError("psproto.codec assumes a little-endian host")


class CodecError(ValueError):
    """A chunk that cannot be decoded; ``reason`` is a stable machine-readable key."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def wire_dtype(dtype: int) -> torch.dtype:
    """The torch dtype of a wire dtype enum; unspecified means float32."""
    if dtype == ps_pb2.DTYPE_UNSPECIFIED:
        return torch.float32
    if dtype == ps_pb2.DTYPE_INT8_BLOCK:
        raise CodecError(
            "push_only_dtype",
            "DTYPE_INT8_BLOCK is for pushes only; Init and pulls are DTYPE_FLOAT32, DTYPE_BFLOAT16 or DTYPE_FLOAT16",
        )
    try:
        return WIRE_DTYPES[DTypeValue(dtype)]
    except KeyError:
        valid = ", ".join(ps_pb2.DType.Name(k) for k in WIRE_DTYPES)
        raise CodecError("unknown_dtype", f"unknown chunk dtype {dtype}; use one of {valid}") from None


def element_size(dtype: int) -> int:
    return _WIDTHS[wire_dtype(dtype)]


def wire_bytes(length: int, dtype: int) -> int:
    """The bytes of ``length`` elements in ``dtype`` on the wire (int8 values and their scales), framing aside."""
    if dtype == ps_pb2.DTYPE_INT8_BLOCK:
        return length + 4 * blocks.block_count(length)
    return length * element_size(dtype)


_WIDTHS = {dtype: torch.empty((), dtype=dtype).element_size() for dtype in WIRE_DTYPES.values()}


class ChunkLike(Protocol):
    """A Chunk message or a ChunkPayload."""

    @property
    def offset(self) -> int: ...

    @property
    def dtype(self) -> int: ...

    @property
    def data(self) -> bytes | memoryview: ...

    @property
    def scales(self) -> bytes | memoryview: ...


@dataclass(frozen=True)
class ChunkPayload:
    """One chunk's fields, to be assigned in place into whatever message carries it."""

    offset: int
    dtype: DTypeValue
    # A view of the (converted) tensor's memory: valid while that tensor is unchanged.
    data: memoryview
    # INT8_BLOCK only: the blocks' fp32 scales, little-endian.
    scales: memoryview | bytes = b""

    def fill(self, chunk: ps_pb2.Chunk) -> None:
        # Assigning fields in place avoids the extra copy a constructor or CopyFrom makes.
        chunk.offset = self.offset
        chunk.dtype = self.dtype
        chunk.data = bytes(self.data)
        if self.scales:
            chunk.scales = bytes(self.scales)


def chunk_spans(length: int, dtype: int = ps_pb2.DTYPE_FLOAT32, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> list[range]:
    """The element ranges ``payloads`` cuts a ``length``-element vector into for ``dtype``.

    INT8_BLOCK chunks hold whole blocks (values and scales within ``chunk_bytes``) except the last."""
    if dtype == ps_pb2.DTYPE_INT8_BLOCK:
        per_chunk = max(1, chunk_bytes // (blocks.BLOCK + 4)) * blocks.BLOCK
    else:
        per_chunk = max(1, chunk_bytes // _WIDTHS[wire_dtype(dtype)])
    return [range(start, min(start + per_chunk, length)) for start in range(0, length, per_chunk)]


def payload(flat: torch.Tensor, span: range, dtype: int = ps_pb2.DTYPE_FLOAT32) -> ChunkPayload:
    """One chunk of a contiguous 1-D CPU tensor, converted to ``dtype`` (a view when no conversion is needed)."""
    piece = flat[span.start : span.stop]
    if dtype == ps_pb2.DTYPE_INT8_BLOCK:
        return block_payload(span.start, *blocks.encode(piece))
    target = wire_dtype(dtype)
    wire = piece if piece.dtype == target else piece.to(target)
    return ChunkPayload(span.start, DTypeValue(dtype or ps_pb2.DTYPE_FLOAT32), wire.view(torch.uint8).numpy().data)


class Chunker:
    """``payload`` for many spans of one tensor in one dtype, e.g. the messages of a pulled version.

    Without a conversion each payload is a slice of one view of the tensor's bytes, made here
    once, rather than a tensor view made per chunk; with one, each chunk is converted as ``payload`` does."""

    def __init__(self, flat: torch.Tensor, dtype: int = ps_pb2.DTYPE_FLOAT32) -> None:
        self._flat = flat
        self._dtype = dtype
        self._bytes: memoryview | None = None
        if dtype != ps_pb2.DTYPE_INT8_BLOCK and flat.dtype == wire_dtype(dtype):
            self._bytes = flat.view(torch.uint8).numpy().data
            self._width = _WIDTHS[flat.dtype]
            self._tag = DTypeValue(dtype or ps_pb2.DTYPE_FLOAT32)

    def payload(self, span: range) -> ChunkPayload:
        if self._bytes is None:
            return payload(self._flat, span, self._dtype)
        width = self._width
        return ChunkPayload(span.start, self._tag, self._bytes[span.start * width : span.stop * width])


def block_payload(offset: int, values: torch.Tensor, scales: torch.Tensor) -> ChunkPayload:
    """An INT8_BLOCK chunk of already encoded values (``blocks.encode``) starting at ``offset``."""
    return ChunkPayload(
        offset, ps_pb2.DTYPE_INT8_BLOCK, values.view(torch.uint8).numpy().data, scales.view(torch.uint8).numpy().data
    )


def payloads(
    flat: torch.Tensor, dtype: int = ps_pb2.DTYPE_FLOAT32, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Iterator[ChunkPayload]:
    """Slice a contiguous 1-D CPU tensor into chunks, converted to ``dtype`` on the way.

    Without a conversion the chunks are views of the tensor's memory: nothing is copied until
    a message is written, so the caller must not change ``flat`` before then. With one, each
    chunk is converted as it is reached, so no model-sized temporary is made and the converted
    chunk is still in cache when its message is written.
    """
    for span in chunk_spans(flat.numel(), dtype, chunk_bytes):
        yield payload(flat, span, dtype)


def encode(
    flat: torch.Tensor, dtype: int = ps_pb2.DTYPE_FLOAT32, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Iterator[ps_pb2.Chunk]:
    """``payloads`` as standalone Chunk messages."""
    for payload in payloads(flat, dtype, chunk_bytes):
        chunk = ps_pb2.Chunk()
        payload.fill(chunk)
        yield chunk


@dataclass
class Assembler:
    """Decodes chunks into a preallocated flat fp32 buffer and checks they cover it exactly.

    Every chunk is checked before it is written; ``finish`` checks that the chunks did not
    overlap and covered the whole buffer. The buffer is scratch: nothing in it is trusted
    until ``finish`` returns. With ``track_finite`` (the server's side: gradients are refused
    when any element is NaN or Inf) each chunk is also summed while it is in cache, for
    ``all_finite``; a worker receiving parameters skips that pass. ``accept_blocks`` (the
    server's push path) decodes INT8_BLOCK chunks; elsewhere they are refused (``push_only_dtype``).
    """

    out: torch.Tensor
    track_finite: bool = True
    accept_blocks: bool = False

    def __post_init__(self) -> None:
        self._spans: list[tuple[int, int]] = []
        self._sum = 0.0

    def add(self, chunk: ChunkLike) -> None:
        if chunk.dtype == ps_pb2.DTYPE_INT8_BLOCK and self.accept_blocks:
            self._add_blocks(chunk)
            return
        dtype = wire_dtype(chunk.dtype)
        if chunk.scales:
            raise CodecError("bad_scales", "only DTYPE_INT8_BLOCK chunks carry scales")
        width = _WIDTHS[dtype]
        if len(chunk.data) % width:
            raise CodecError(
                "bad_chunk_size",
                f"chunk at offset {chunk.offset} has {len(chunk.data)} bytes, not a multiple of "
                f"{width} ({ps_pb2.DType.Name(DTypeValue(chunk.dtype or ps_pb2.DTYPE_FLOAT32))})",
            )
        count = len(chunk.data) // width
        self._check_range(chunk.offset, count)
        if count == 0:
            return
        values = torch.frombuffer(chunk.data, dtype=dtype)
        destination = self.out[chunk.offset : chunk.offset + count]
        destination.copy_(values)
        self._added(chunk.offset, destination)

    def _add_blocks(self, chunk: ChunkLike) -> None:
        count = len(chunk.data)
        self._check_range(chunk.offset, count)
        if len(chunk.scales) % 4:
            raise CodecError(
                "bad_scales",
                f"chunk at offset {chunk.offset} has scales of {len(chunk.scales)} bytes, "
                "not a multiple of 4 (float32)",
            )
        scales = torch.frombuffer(chunk.scales, dtype=torch.float32) if chunk.scales else torch.empty(0)
        try:
            safe = blocks.check_scales(scales, count)
        except blocks.ScalesError as error:
            reason = "non_finite_scale" if error.non_finite else "bad_scales"
            raise CodecError(reason, f"chunk at offset {chunk.offset}: {error}") from None
        if count == 0:
            return
        destination = self.out[chunk.offset : chunk.offset + count]
        blocks.decode(torch.frombuffer(chunk.data, dtype=torch.int8), scales, destination)
        # |q · s| <= 127 · s: with every scale at most the bound no decoded value can overflow, so
        # the chunk is finite without summing it (a few hundred scales read instead of the values).
        self._added(chunk.offset, destination, known_finite=safe)

    def _check_range(self, offset: int, count: int) -> None:
        length = self.out.numel()
        if offset + count > length:
            raise CodecError(
                "chunk_out_of_range",
                f"chunk [{offset}, {offset + count}) lies outside the shard's "
                f"{length} elements; offsets count elements from the start of the shard",
            )

    def _added(self, offset: int, destination: torch.Tensor, known_finite: bool = False) -> None:
        if self.track_finite and not known_finite:
            # Summed while the chunk is still in cache: any NaN or Inf makes the sum non-finite.
            self._sum += float(destination.sum())
        self._spans.append((offset, offset + destination.numel()))

    def finish(self) -> None:
        covered = 0
        previous_end = 0
        for start, end in sorted(self._spans):
            if start < previous_end:
                raise CodecError("overlapping_chunks", f"chunks overlap at element {start}; send each element once")
            covered += end - start
            previous_end = end
        if covered != self.out.numel():
            raise CodecError(
                "wrong_length",
                f"received {covered} elements but this shard holds {self.out.numel()}; "
                "send every element of the shard exactly once",
            )

    def all_finite(self) -> bool:
        """True when no element is NaN or Inf (exact: a non-finite sum of finite values is re-checked)."""
        if not self.track_finite:
            return bool(torch.isfinite(self.out).all())
        return math.isfinite(self._sum) or bool(torch.isfinite(self.out).all())

    def count_non_finite(self) -> int:
        return int((~torch.isfinite(self.out)).sum())
