from __future__ import annotations

import pytest
import torch

from psproto import codec
from psproto.v1 import ps_pb2


@pytest.mark.parametrize("dtype", [ps_pb2.DTYPE_FLOAT32, ps_pb2.DTYPE_BFLOAT16, ps_pb2.DTYPE_FLOAT16])
def test_round_trip_through_small_chunks(dtype: ps_pb2.DType.ValueType) -> None:
    flat = torch.randn(1000)
    chunks = list(codec.encode(flat, dtype, chunk_bytes=256))
    assert len(chunks) > 1
    assert all(len(c.data) <= 256 for c in chunks)
    out = torch.empty(1000)
    assembler = codec.Assembler(out)
    for chunk in reversed(chunks):  # order does not matter, coverage does
        assembler.add(chunk)
    assembler.finish()
    expected = flat.to(codec.wire_dtype(dtype)).float()
    torch.testing.assert_close(out, expected)


def test_fp32_is_bit_exact() -> None:
    flat = torch.randn(333)
    out = torch.empty(333)
    assembler = codec.Assembler(out)
    for chunk in codec.encode(flat, chunk_bytes=100):
        assembler.add(chunk)
    assembler.finish()
    assert torch.equal(out, flat)


@pytest.mark.parametrize(
    "dtype",
    [
        ps_pb2.DTYPE_UNSPECIFIED,
        ps_pb2.DTYPE_FLOAT32,
        ps_pb2.DTYPE_BFLOAT16,
        ps_pb2.DTYPE_FLOAT16,
        ps_pb2.DTYPE_INT8_BLOCK,
    ],
)
def test_a_chunker_gives_what_payload_gives(dtype: ps_pb2.DType.ValueType) -> None:
    flat = torch.randn(1000)
    chunker = codec.Chunker(flat, dtype)
    for span in codec.chunk_spans(flat.numel(), dtype, 256):
        ours, theirs = chunker.payload(span), codec.payload(flat, span, dtype)
        assert (ours.offset, ours.dtype, bytes(ours.data), bytes(ours.scales)) == (
            theirs.offset,
            theirs.dtype,
            bytes(theirs.data),
            bytes(theirs.scales),
        )


def test_bf16_halves_the_bytes() -> None:
    flat = torch.randn(1024)
    fp32 = sum(len(c.data) for c in codec.encode(flat, ps_pb2.DTYPE_FLOAT32))
    bf16 = sum(len(c.data) for c in codec.encode(flat, ps_pb2.DTYPE_BFLOAT16))
    assert fp32 == 4096
    assert bf16 == 2048


def _chunk(offset: int, values: list[float], dtype: int = ps_pb2.DTYPE_FLOAT32) -> ps_pb2.Chunk:
    chunk = ps_pb2.Chunk(offset=offset)
    chunk.dtype = dtype  # type: ignore[assignment]
    chunk.data = torch.tensor(values, dtype=torch.float32).numpy().tobytes()
    return chunk


@pytest.mark.parametrize(
    ("chunks", "reason"),
    [
        ([_chunk(0, [1, 2, 3])], "wrong_length"),
        ([_chunk(0, [1, 2, 3, 4]), _chunk(2, [1, 2])], "overlapping_chunks"),
        ([_chunk(3, [1, 2])], "chunk_out_of_range"),
        ([_chunk(0, [1, 2, 3, 4], dtype=9)], "unknown_dtype"),
    ],
)
def test_bad_chunks_are_refused_with_a_reason(chunks: list[ps_pb2.Chunk], reason: str) -> None:
    assembler = codec.Assembler(torch.zeros(4))
    with pytest.raises(codec.CodecError) as caught:
        for chunk in chunks:
            assembler.add(chunk)
        assembler.finish()
    assert caught.value.reason == reason


def test_ragged_bytes_are_refused() -> None:
    chunk = ps_pb2.Chunk(offset=0, dtype=ps_pb2.DTYPE_FLOAT32)
    chunk.data = b"\x00" * 6
    with pytest.raises(codec.CodecError) as caught:
        codec.Assembler(torch.zeros(4)).add(chunk)
    assert caught.value.reason == "bad_chunk_size"


def test_finite_check_is_exact_even_when_the_sum_overflows() -> None:
    big = torch.full((8,), 3e38)
    assembler = codec.Assembler(torch.empty(8))
    for chunk in codec.encode(big, chunk_bytes=8):
        assembler.add(chunk)
    assembler.finish()
    assert assembler.all_finite()
    for bad in (float("nan"), float("inf"), float("-inf")):
        values = torch.ones(8)
        values[5] = bad
        assembler = codec.Assembler(torch.empty(8))
        for chunk in codec.encode(values, chunk_bytes=8):
            assembler.add(chunk)
        assert not assembler.all_finite()
        assert assembler.count_non_finite() == 1


@pytest.mark.parametrize("track_finite", [True, False])
def test_finite_check_holds_with_or_without_the_running_sum(track_finite: bool) -> None:
    values = torch.ones(8)
    values[3] = float("nan")
    for data, finite in ((torch.ones(8), True), (values, False)):
        assembler = codec.Assembler(torch.empty(8), track_finite=track_finite)
        for chunk in codec.encode(data, chunk_bytes=8):
            assembler.add(chunk)
        assembler.finish()
        assert assembler.all_finite() is finite


def test_payloads_fill_messages_in_place() -> None:
    flat = torch.arange(6, dtype=torch.float32)
    parts = list(codec.payloads(flat, ps_pb2.DTYPE_FLOAT16, chunk_bytes=4))
    assert [p.offset for p in parts] == [0, 2, 4]
    message = ps_pb2.PushRequest()
    parts[1].fill(message.chunk)
    assert message.chunk.offset == 2 and message.chunk.dtype == ps_pb2.DTYPE_FLOAT16
    assert torch.equal(
        torch.frombuffer(bytearray(message.chunk.data), dtype=torch.float16), torch.tensor([2.0, 3.0]).half()
    )
