"""The hand-written wire shapes must be exactly what the generated code writes and reads."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from psproto import wire
from psproto.v1 import ps_pb2

offsets = st.integers(min_value=0, max_value=2**40)
dtypes = st.sampled_from([0, 1, 2, 3, 200])
payloads = st.binary(max_size=300)


def _chunk(offset: int, dtype: int, data: bytes) -> ps_pb2.Chunk:
    chunk = ps_pb2.Chunk(offset=offset, data=data)
    chunk.dtype = dtype  # type: ignore[assignment]
    return chunk


@given(offsets, dtypes, payloads)
def test_push_and_init_chunks_match_the_generated_code(offset: int, dtype: int, data: bytes) -> None:
    push = ps_pb2.PushRequest()
    push.chunk.CopyFrom(_chunk(offset, dtype, data))
    assert wire.chunk_in(2, offset, dtype, memoryview(data)) == push.SerializeToString()
    init = ps_pb2.InitRequest()
    init.chunk.CopyFrom(_chunk(offset, dtype, data))
    assert wire.chunk_in(2, offset, dtype, data) == init.SerializeToString()


@given(offsets, payloads, st.binary(max_size=40))
def test_int8_block_chunks_with_scales_match_the_generated_code(offset: int, data: bytes, scales: bytes) -> None:
    push = ps_pb2.PushRequest()
    push.chunk.CopyFrom(_chunk(offset, ps_pb2.DTYPE_INT8_BLOCK, data))
    push.chunk.scales = scales
    encoded = wire.chunk_in(2, offset, ps_pb2.DTYPE_INT8_BLOCK, memoryview(data), memoryview(scales))
    assert encoded == push.SerializeToString()
    view = wire.parse_chunk_request(encoded)
    assert isinstance(view, wire.ChunkView)
    assert (view.offset, view.dtype, bytes(view.data), bytes(view.scales)) == (
        offset,
        ps_pb2.DTYPE_INT8_BLOCK,
        data,
        scales,
    )


def test_truncated_scales_are_refused() -> None:
    chunk = _chunk(0, ps_pb2.DTYPE_INT8_BLOCK, b"ab")
    chunk.scales = b"\x00\x00\x80\x3f"
    with pytest.raises(wire.WireError, match="scales"):
        wire.parse_chunk(memoryview(chunk.SerializeToString()[:-1]))


@given(st.integers(0, 2**40), st.integers(0, 2**40), offsets, dtypes, payloads)
def test_pull_replies_match_the_generated_code(clock: int, total: int, offset: int, dtype: int, data: bytes) -> None:
    reply = ps_pb2.PullResponse(clock=clock, total_length=total)
    reply.chunk.CopyFrom(_chunk(offset, dtype, data))
    assert wire.pull_response(clock, total, offset, dtype, data) == reply.SerializeToString()
    both = ps_pb2.PushPullResponse()
    both.params.CopyFrom(reply)
    assert wire.push_pull_params(clock, total, offset, dtype, data) == both.SerializeToString()


@pytest.mark.parametrize("value", [0, 1, 0x7F, 0x80, 0x3FFF, 0x4000, 0x1FFFFF, 0x200000, 2**35, 2**63 - 1])
def test_every_varint_length_matches_the_generated_code(value: int) -> None:
    reply = ps_pb2.PullResponse(clock=value, total_length=value)
    reply.chunk.CopyFrom(_chunk(value, 1, b"ab"))
    assert wire.pull_response(value, value, value, 1, b"ab") == reply.SerializeToString()
    assert wire.parse_pull_response(reply.SerializeToString()).chunk.offset == value
    with pytest.raises(ValueError):
        wire.pull_response(-1, 0, 0, 1, b"")


@pytest.mark.parametrize("offset", [b"\x80\x00", b"\xff\x80\x00", b"\x81\x80\x80\x00", b"\xff\xff\x7f"])
def test_varints_in_more_bytes_than_needed_read_as_the_generated_code_reads_them(offset: bytes) -> None:
    encoded = b"\x08" + offset + b"\x10\x01\x1a\x02ab"
    view = wire.parse_chunk(memoryview(encoded))
    assert (view.offset, view.dtype, bytes(view.data)) == (ps_pb2.Chunk.FromString(encoded).offset, 1, b"ab")


@given(offsets, dtypes, payloads)
def test_parse_chunk_reads_what_the_generated_code_writes(offset: int, dtype: int, data: bytes) -> None:
    encoded = _chunk(offset, dtype, data).SerializeToString()
    view = wire.parse_chunk(memoryview(encoded))
    assert (view.offset, view.dtype, bytes(view.data)) == (offset, dtype, data)


def test_parse_chunk_skips_unknown_fields_and_refuses_truncation() -> None:
    encoded = _chunk(5, 1, b"abcd").SerializeToString() + b"\x28\x07"  # field 5, varint 7
    assert bytes(wire.parse_chunk(memoryview(encoded)).data) == b"abcd"
    with pytest.raises(wire.WireError):
        wire.parse_chunk(memoryview(_chunk(5, 1, b"abcd").SerializeToString()[:-1]))
    with pytest.raises(wire.WireError):
        wire.parse_chunk(memoryview(b"\x08\xff"))


@given(st.binary(max_size=64))
def test_random_bytes_never_crash_the_parser(data: bytes) -> None:
    with contextlib.suppress(wire.WireError):
        wire.parse_chunk(memoryview(data))
    assert wire.parse_chunk_request(data) is None or isinstance(
        wire.parse_chunk_request(data), (wire.ChunkView, wire.Malformed)
    )


@given(offsets, dtypes, payloads)
def test_chunk_requests_parse_without_copying(offset: int, dtype: int, data: bytes) -> None:
    request = ps_pb2.PushRequest()
    request.chunk.CopyFrom(_chunk(offset, dtype, data))
    view = wire.parse_chunk_request(request.SerializeToString())
    assert isinstance(view, wire.ChunkView)
    assert (view.offset, view.dtype, bytes(view.data)) == (offset, dtype, data)


def test_headers_and_garbage_are_told_apart() -> None:
    header = ps_pb2.PushRequest(header=ps_pb2.PushHeader(worker_id=3, push_id=1)).SerializeToString()
    assert wire.parse_chunk_request(header) is None
    assert wire.parse_chunk_request(b"") is None
    assert isinstance(wire.parse_chunk_request(b"\x12\x09\x08"), wire.Malformed)


@given(st.integers(0, 2**40), st.integers(0, 2**40), offsets, dtypes, payloads)
def test_pull_replies_parse_without_copying(clock: int, total: int, offset: int, dtype: int, data: bytes) -> None:
    reply = ps_pb2.PullResponse(clock=clock, total_length=total)
    reply.chunk.CopyFrom(_chunk(offset, dtype, data))
    parsed = wire.parse_pull_response(reply.SerializeToString())
    assert (parsed.clock, parsed.total_length, parsed.chunk.offset, parsed.chunk.dtype) == (clock, total, offset, dtype)
    assert bytes(parsed.chunk.data) == data
    both = ps_pb2.PushPullResponse()
    both.params.CopyFrom(reply)
    field, body = wire.split_push_pull_response(both.SerializeToString())
    assert field == 2 and wire.parse_pull_response(body) == parsed


def test_push_pull_ack_is_split_out() -> None:
    ack = ps_pb2.PushPullResponse(ack=ps_pb2.PushResponse(clock=7, staleness=2)).SerializeToString()
    field, body = wire.split_push_pull_response(ack)
    assert field == 1 and ps_pb2.PushResponse.FromString(bytes(body)).staleness == 2
    with pytest.raises(wire.WireError):
        wire.split_push_pull_response(b"")


@given(st.lists(st.tuples(offsets, dtypes, payloads, st.binary(max_size=40)), max_size=4))
def test_a_unary_push_pull_request_is_the_stream_s_messages_one_after_another(
    chunks: list[tuple[int, int, bytes, bytes]],
) -> None:
    header = ps_pb2.PushHeader(worker_id=3, push_id=9, base_clock=2, pull_dtype=ps_pb2.DTYPE_BFLOAT16)
    messages = []
    for offset, dtype, data, scales in chunks:
        message = _chunk(offset, dtype, data)
        message.scales = scales
        messages.append(message)
    request = ps_pb2.PushPullUnaryRequest(header=header, chunks=messages)
    stream = [ps_pb2.PushRequest(header=header).SerializeToString()]
    stream += [b"".join(wire.chunk_parts(2, *chunk)) for chunk in chunks]
    assert b"".join(stream) == request.SerializeToString()
    fields = wire.length_delimited_fields(request.SerializeToString())
    assert [field for field, _ in fields] == [1] + [2] * len(chunks)
    assert ps_pb2.PushHeader.FromString(bytes(fields[0][1])) == header
    assert [wire.parse_chunk(body) for _, body in fields[1:]] == [
        wire.ChunkView(offset, dtype, memoryview(data), scales) for offset, dtype, data, scales in chunks
    ]


def test_a_unary_push_pull_reply_splits_into_the_ack_and_the_parameters_in_order() -> None:
    ack = ps_pb2.PushResponse(clock=5, staleness=1, telemetry={"scale": 0.5})
    params = [wire.pull_response(5, 8, offset, 1, bytes(range(offset, offset + 16))) for offset in (0, 4)]
    reply = ps_pb2.PushPullUnaryResponse(ack=ack, params=[ps_pb2.PullResponse.FromString(p) for p in params])
    fields = wire.length_delimited_fields(reply.SerializeToString())
    assert [field for field, _ in fields] == [1, 2, 2]
    assert ps_pb2.PushResponse.FromString(bytes(fields[0][1])) == ack
    assert [bytes(body) for _, body in fields[1:]] == params


def test_length_delimited_fields_skip_unknown_fields_and_refuse_what_is_not_a_message() -> None:
    unknown = b"\x18\x07" + b"\x22\x01x"  # field 3 (a varint) and field 4 (bytes): skipped
    assert wire.length_delimited_fields(unknown + b"\x0a\x00") == [(1, memoryview(b""))]
    with pytest.raises(wire.WireError, match="field 1 is not length-delimited"):
        wire.length_delimited_fields(b"\x08\x01")
    with pytest.raises(wire.WireError, match="truncated field 2"):
        wire.length_delimited_fields(b"\x12\x05ab")
    with pytest.raises(wire.WireError, match="past the end"):
        wire.length_delimited_fields(b"\x1d\x00")  # field 3, fixed32, with one byte of its four
    assert len(wire.length_delimited_fields(b"\x12\x00" * 3, limit=3)) == 3
    with pytest.raises(wire.WireError, match="more than 3 headers and chunks"):
        wire.length_delimited_fields(b"\x12\x00" * 4, limit=3)
