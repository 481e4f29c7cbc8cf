"""Tensor encoding for the wire: flat fp32 tensors to and from dtype-tagged chunks.

This is the only place that knows how elements become bytes. Chunks are slices of a
flat vector, little-endian, at most ``DEFAULT_CHUNK_BYTES`` each, so no message nears
gRPC's size limits. Decoding writes straight into a caller-owned buffer.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TypeAlias

import torch

from psproto.v1 import ps_pb2

DEFAULT_CHUNK_BYTES = 2 * 1024 * 1024

DTypeValue: TypeAlias = ps_pb2.DType.ValueType

WIRE_DTYPES: dict[DTypeValue, torch.dtype] = {
    ps_pb2.DTYPE_FLOAT32: torch.float32,
    ps_pb2.DTYPE_BFLOAT16: torch.bfloat16,
    ps_pb2.DTYPE_FLOAT16: torch.float16,
}
WIRE_DTYPE_NAMES: dict[str, DTypeValue] = {
    "fp32": ps_pb2.DTYPE_FLOAT32,
    "bf16": ps_pb2.DTYPE_BFLOAT16,
    "fp16": ps_pb2.DTYPE_FLOAT16,
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
    try:
        return WIRE_DTYPES[DTypeValue(dtype)]
    except KeyError:
        valid = ", ".join(ps_pb2.DType.Name(k) for k in WIRE_DTYPES)
        raise CodecError("unknown_dtype", f"unknown chunk dtype {dtype}; use one of {valid}") from None


def element_size(dtype: int) -> int:
    return torch.empty((), dtype=wire_dtype(dtype)).element_size()


def encode(
    flat: torch.Tensor, dtype: int = ps_pb2.DTYPE_FLOAT32, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Iterator[ps_pb2.Chunk]:
    """Yield chunks of a contiguous 1-D CPU tensor, converted to ``dtype`` on the way.

    Each chunk's bytes are copied once, from the (converted) tensor into the message.
    """
    target = wire_dtype(dtype)
    wire = flat if flat.dtype == target else flat.to(target)
    per_chunk = max(1, chunk_bytes // wire.element_size())
    data = wire.view(torch.uint8) if wire.numel() else wire
    width = wire.element_size()
    for start in range(0, wire.numel(), per_chunk):
        stop = min(start + per_chunk, wire.numel())
        chunk = ps_pb2.Chunk(offset=start, dtype=DTypeValue(dtype or ps_pb2.DTYPE_FLOAT32))
        # Assigning the field in place avoids a second copy made by the constructor.
        chunk.data = data[start * width : stop * width].numpy().tobytes()
        yield chunk


@dataclass
class Assembler:
    """Decodes chunks into a preallocated flat fp32 buffer and checks they cover it exactly.

    Every chunk is checked before it is written; ``finish`` checks that the chunks did not
    overlap and covered the whole buffer. The buffer is scratch: nothing in it is trusted
    until ``finish`` returns.
    """

    out: torch.Tensor

    def __post_init__(self) -> None:
        self._spans: list[tuple[int, int]] = []

    def add(self, chunk: ps_pb2.Chunk) -> None:
        dtype = wire_dtype(chunk.dtype)
        width = torch.empty((), dtype=dtype).element_size()
        if len(chunk.data) % width:
            raise CodecError(
                "bad_chunk_size",
                f"chunk at offset {chunk.offset} has {len(chunk.data)} bytes, not a multiple of "
                f"{width} ({ps_pb2.DType.Name(chunk.dtype or ps_pb2.DTYPE_FLOAT32)})",
            )
        count = len(chunk.data) // width
        length = self.out.numel()
        if chunk.offset + count > length:
            raise CodecError(
                "chunk_out_of_range",
                f"chunk [{chunk.offset}, {chunk.offset + count}) lies outside the shard's "
                f"{length} elements; offsets count elements from the start of the shard",
            )
        if count == 0:
            return
        values = torch.frombuffer(chunk.data, dtype=dtype)
        self.out[chunk.offset : chunk.offset + count].copy_(values)
        self._spans.append((chunk.offset, chunk.offset + count))

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
