"""INT8_BLOCK chunks: how psproto.codec cuts, encodes and decodes 8-bit pushes, and what it refuses."""

from __future__ import annotations

import pytest
import torch

from psproto import blocks, codec
from psproto.blocks import BLOCK
from psproto.v1 import ps_pb2


def _assemble(chunks: list[ps_pb2.Chunk], length: int) -> torch.Tensor:
    out = torch.full((length,), float("nan"))
    assembler = codec.Assembler(out, accept_blocks=True)
    for chunk in chunks:
        assembler.add(chunk)
    assembler.finish()
    assert assembler.all_finite()
    return out


def test_chunks_hold_whole_blocks_from_their_offset_except_the_last() -> None:
    length = 5 * BLOCK + 123
    flat = torch.randn(length)
    chunk_bytes = 2 * (BLOCK + 4)  # two blocks and their scales
    chunks = list(codec.encode(flat, codec.INT8_BLOCK, chunk_bytes=chunk_bytes))
    assert [c.offset for c in chunks] == [0, 2 * BLOCK, 4 * BLOCK]
    assert [len(c.data) for c in chunks] == [2 * BLOCK, 2 * BLOCK, BLOCK + 123]
    assert [len(c.scales) for c in chunks] == [8, 8, 8]
    assert all(len(c.data) + len(c.scales) <= chunk_bytes for c in chunks)
    out = _assemble(list(reversed(chunks)), length)
    # Each chunk decodes as the codec applied to its own slice: blocks start at its offset.
    for chunk in chunks:
        piece = flat[chunk.offset : chunk.offset + len(chunk.data)]
        q, scales = blocks.encode(piece)
        assert bytes(chunk.scales) == scales.numpy().tobytes()
        expected = torch.empty_like(piece)
        blocks.decode(q, scales, expected)
        assert torch.equal(out[chunk.offset : chunk.offset + len(chunk.data)], expected)


def test_an_int8_push_is_under_a_third_of_fp32s_bytes() -> None:
    length = 1_000_003
    assert codec.wire_bytes(length, codec.INT8_BLOCK) == length + 4 * 245
    assert codec.wire_bytes(length, codec.INT8_BLOCK) <= 0.26 * codec.wire_bytes(length, codec.FLOAT32)
    chunks = list(codec.encode(torch.randn(length), codec.INT8_BLOCK))
    assert sum(len(c.data) + len(c.scales) for c in chunks) == codec.wire_bytes(length, codec.INT8_BLOCK)


def test_int8_is_refused_where_only_floats_go() -> None:
    (chunk,) = codec.encode(torch.ones(8), codec.INT8_BLOCK)
    with pytest.raises(codec.CodecError) as caught:
        codec.Assembler(torch.empty(8)).add(chunk)  # Init and pulls: no accept_blocks
    assert caught.value.reason == "push_only_dtype"
    with pytest.raises(codec.CodecError, match="pushes only"):
        codec.wire_dtype(codec.INT8_BLOCK)
    assert "never sent below 16 bits" in codec.pull_dtype_problem("int8")


def _block_chunk(values: list[int], scales: list[float]) -> ps_pb2.Chunk:
    chunk = ps_pb2.Chunk(offset=0, dtype=ps_pb2.DTYPE_INT8_BLOCK)
    chunk.data = torch.tensor(values, dtype=torch.int8).numpy().tobytes()
    chunk.scales = torch.tensor(scales, dtype=torch.float32).numpy().tobytes()
    return chunk


@pytest.mark.parametrize(
    ("scales", "reason"),
    [
        ([], "bad_scales"),
        ([1.0, 1.0], "bad_scales"),
        ([-1.0], "bad_scales"),
        ([float("nan")], "non_finite_scale"),
        ([float("inf")], "non_finite_scale"),
        ([float("-inf")], "non_finite_scale"),
    ],
)
def test_malformed_blocks_are_refused_before_anything_is_written(scales: list[float], reason: str) -> None:
    out = torch.zeros(4)
    assembler = codec.Assembler(out, accept_blocks=True)
    with pytest.raises(codec.CodecError) as caught:
        assembler.add(_block_chunk([1, 2, 3, 4], scales))
    assert caught.value.reason == reason
    assert torch.equal(out, torch.zeros(4))


def test_scales_of_a_ragged_byte_count_or_on_a_float_chunk_are_refused() -> None:
    ragged = _block_chunk([1, 2], [1.0])
    ragged.scales = ragged.scales[:3]
    float_chunk = next(codec.encode(torch.ones(2)))
    float_chunk.scales = b"\x00\x00\x80\x3f"
    for chunk in (ragged, float_chunk):
        with pytest.raises(codec.CodecError) as caught:
            codec.Assembler(torch.zeros(2), accept_blocks=True).add(chunk)
        assert caught.value.reason == "bad_scales"


def test_an_int8_chunk_past_the_end_is_out_of_range() -> None:
    chunk = _block_chunk([1, 2, 3], [1.0])
    chunk.offset = 2
    with pytest.raises(codec.CodecError) as caught:
        codec.Assembler(torch.zeros(4), accept_blocks=True).add(chunk)
    assert caught.value.reason == "chunk_out_of_range"


@pytest.mark.parametrize(("above", "finite"), [(False, True), (True, False)])
def test_a_scale_large_enough_to_overflow_is_found_non_finite(above: bool, finite: bool) -> None:
    """Chunks whose scales cannot overflow are not summed; one that can is, and its Inf is found."""
    largest = torch.tensor(blocks.LARGEST_SAFE_SCALE)
    scale = torch.nextafter(largest, torch.tensor(float("inf"))) if above else largest
    chunk = ps_pb2.Chunk(
        offset=0,
        dtype=ps_pb2.DTYPE_INT8_BLOCK,
        data=torch.full((BLOCK,), 127, dtype=torch.int8).numpy().tobytes(),
        scales=scale.reshape(1).numpy().tobytes(),
    )
    out = torch.empty(BLOCK)
    assembler = codec.Assembler(out, accept_blocks=True)
    assembler.add(chunk)
    assembler.finish()
    assert assembler.all_finite() is finite
    assert bool(torch.isfinite(out).all()) is finite
