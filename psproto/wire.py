"""Chunk-carrying messages written and read as protobuf wire bytes, without intermediate copies.

The generated classes copy a chunk's bytes when the field is assigned, again when the message
is serialised, and again when it is parsed. For multi-MiB chunks these copies dominate a step,
so the hot path builds and parses the few fixed shapes below by hand: each serialised message is
a short header plus the chunk's bytes, joined with one copy straight from tensor memory, and
parsing returns a view of the received buffer. Tests check every shape against the generated
code, byte for byte.

Field numbers (protos/psproto/v1/ps.proto): Chunk{offset=1, dtype=2, data=3, scales=4};
PullResponse{clock=1, total_length=2, chunk=3}; PushRequest{header=1, chunk=2};
InitRequest{header=1, chunk=2}; PushPullResponse{ack=1, params=2}.
"""

from __future__ import annotations

from dataclasses import dataclass

_VARINT = 0
_LEN = 2


# Every key here and most small values are one byte: made once, not per message.
_ONE_BYTE = tuple(bytes((value,)) for value in range(0x80))


def _varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _ONE_BYTE[value]
    if value < 0:
        raise ValueError("varints here are never negative")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def _chunk_header(offset: int, dtype: int, size: int) -> bytes:
    """A Chunk message's bytes up to (not including) its data."""
    head = b""
    if offset:
        head += _key(1, _VARINT) + _varint(offset)
    if dtype:
        head += _key(2, _VARINT) + _varint(dtype)
    if size:
        head += _key(3, _LEN) + _varint(size)
    return head


def _nest(field: int, head: bytes, size: int) -> bytes:
    """Header of a length-delimited field whose body is ``head`` followed by ``size`` more bytes."""
    return _key(field, _LEN) + _varint(len(head) + size) + head


def chunk_in(field: int, offset: int, dtype: int, data: memoryview | bytes, scales: memoryview | bytes = b"") -> bytes:
    """A message whose only field ``field`` is a Chunk (PushRequest.chunk or InitRequest.chunk: 2).

    ``scales`` (DTYPE_INT8_BLOCK only) follow the data, as field 4."""
    head = _chunk_header(offset, dtype, len(data))
    tail = _key(4, _LEN) + _varint(len(scales)) if scales else b""
    return b"".join((_nest(field, head, len(data) + len(tail) + len(scales)), data, tail, scales))


def _pull_response_head(clock: int, total_length: int, offset: int, dtype: int, size: int) -> bytes:
    head = b""
    if clock:
        head += _key(1, _VARINT) + _varint(clock)
    if total_length:
        head += _key(2, _VARINT) + _varint(total_length)
    return head + _nest(3, _chunk_header(offset, dtype, size), size)


def pull_response(clock: int, total_length: int, offset: int, dtype: int, data: memoryview | bytes) -> bytes:
    """A serialised PullResponse."""
    return b"".join((_pull_response_head(clock, total_length, offset, dtype, len(data)), data))


def push_pull_params(clock: int, total_length: int, offset: int, dtype: int, data: memoryview | bytes) -> bytes:
    """A serialised PushPullResponse carrying ``params`` (a PullResponse)."""
    head = _pull_response_head(clock, total_length, offset, dtype, len(data))
    return b"".join((_nest(2, head, len(data)), data))


@dataclass(frozen=True)
class ChunkView:
    """A parsed Chunk whose ``data`` is a view into the received message (no copy)."""

    offset: int
    dtype: int
    data: memoryview
    scales: memoryview | bytes = b""


class WireError(ValueError):
    """Bytes that are not a well-formed message of the expected shape."""


def _read_varint(buffer: memoryview, position: int) -> tuple[int, int]:
    if position < len(buffer) and buffer[position] < 0x80:
        return buffer[position], position + 1  # keys, dtypes, small numbers: one byte
    value = 0
    shift = 0
    while True:
        if position >= len(buffer):
            raise WireError("truncated varint")
        byte = buffer[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
        if shift > 63:
            raise WireError("varint longer than 64 bits")


def _read_bytes(buffer: memoryview, position: int, what: str) -> tuple[memoryview, int]:
    """A length-delimited field's bytes (a view, no copy) and the position after them."""
    size, position = _read_varint(buffer, position)
    if position + size > len(buffer):
        raise WireError(f"truncated {what}")
    return buffer[position : position + size], position + size


def _skip(buffer: memoryview, position: int, wire_type: int) -> int:
    if wire_type == _VARINT:
        return _read_varint(buffer, position)[1]
    if wire_type == _LEN:
        size, position = _read_varint(buffer, position)
        if position + size > len(buffer):
            raise WireError("truncated length-delimited field")
        return position + size
    if wire_type == 1:
        return position + 8
    if wire_type == 5:
        return position + 4
    raise WireError(f"unsupported wire type {wire_type}")


def parse_chunk(buffer: memoryview) -> ChunkView:
    """Parse a Chunk message's bytes; unknown fields are skipped as protobuf requires."""
    offset = dtype = 0
    data = scales = buffer[0:0]
    position = 0
    while position < len(buffer):
        key, position = _read_varint(buffer, position)
        field, wire_type = key >> 3, key & 7
        if field == 1 and wire_type == _VARINT:
            offset, position = _read_varint(buffer, position)
        elif field == 2 and wire_type == _VARINT:
            dtype, position = _read_varint(buffer, position)
        elif field == 3 and wire_type == _LEN:
            data, position = _read_bytes(buffer, position, "chunk data")
        elif field == 4 and wire_type == _LEN:
            scales, position = _read_bytes(buffer, position, "chunk scales")
        else:
            position = _skip(buffer, position, wire_type)
    if position != len(buffer):
        raise WireError("a field runs past the end of the chunk")
    return ChunkView(offset, dtype, data, scales)


@dataclass(frozen=True)
class Malformed:
    """A message that could not be parsed; the servicer answers INVALID_ARGUMENT with ``reason``."""

    reason: str


def parse_chunk_request(data: bytes) -> ChunkView | Malformed | None:
    """Parse a PushRequest/InitRequest holding only a chunk (field 2) without copying its data.

    Returns None when the message is anything else (a header), for the generated parser.
    """
    buffer = memoryview(data)
    position = 0
    body: memoryview | None = None
    try:
        while position < len(buffer):
            key, position = _read_varint(buffer, position)
            field, wire_type = key >> 3, key & 7
            if field != 2 or wire_type != _LEN:
                return None
            size, position = _read_varint(buffer, position)
            if position + size > len(buffer):
                return Malformed("truncated chunk")
            body = buffer[position : position + size]
            position += size
        return None if body is None else parse_chunk(body)
    except WireError as error:
        return Malformed(str(error))


@dataclass(frozen=True)
class PulledChunk:
    """A parsed PullResponse: the clock, the shard's length and a view of the chunk."""

    clock: int
    total_length: int
    chunk: ChunkView


def parse_pull_response(data: bytes | memoryview) -> PulledChunk:
    buffer = memoryview(data)
    clock = total = 0
    chunk = ChunkView(0, 0, buffer[0:0])
    position = 0
    while position < len(buffer):
        key, position = _read_varint(buffer, position)
        field, wire_type = key >> 3, key & 7
        if field == 1 and wire_type == _VARINT:
            clock, position = _read_varint(buffer, position)
        elif field == 2 and wire_type == _VARINT:
            total, position = _read_varint(buffer, position)
        elif field == 3 and wire_type == _LEN:
            size, position = _read_varint(buffer, position)
            if position + size > len(buffer):
                raise WireError("truncated chunk")
            chunk = parse_chunk(buffer[position : position + size])
            position += size
        else:
            position = _skip(buffer, position, wire_type)
    if position != len(buffer):
        raise WireError("a field runs past the end of the message")
    return PulledChunk(clock, total, chunk)


def split_push_pull_response(data: bytes) -> tuple[int, memoryview]:
    """(field number, body) of a PushPullResponse: 1 is the ack (a PushResponse), 2 the params."""
    buffer = memoryview(data)
    position = 0
    found: tuple[int, memoryview] | None = None
    while position < len(buffer):
        key, position = _read_varint(buffer, position)
        field, wire_type = key >> 3, key & 7
        if field in (1, 2) and wire_type == _LEN:
            size, position = _read_varint(buffer, position)
            if position + size > len(buffer):
                raise WireError("truncated field")
            found = (field, buffer[position : position + size])
            position += size
        else:
            position = _skip(buffer, position, wire_type)
    if found is None:
        raise WireError("a PushPullResponse with neither ack nor params")
    return found
