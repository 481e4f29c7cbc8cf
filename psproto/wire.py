"""Chunk-carrying messages written and read as protobuf wire bytes, without intermediate copies.

The generated classes copy a chunk's bytes when the field is assigned, again when the message
is serialised, and again when it is parsed. For multi-MiB chunks these copies dominate a step,
so the hot path builds and parses the few fixed shapes below by hand: each serialised message is
a short header plus the chunk's bytes, joined with one copy straight from tensor memory, and
parsing returns a view of the received buffer. Tests check every shape against the generated
code, byte for byte.

Field numbers (protos/psproto/v1/ps.proto): Chunk{offset=1, dtype=2, data=3, scales=4};
PullResponse{clock=1, total_length=2, chunk=3}; PushRequest{header=1, chunk=2};
InitRequest{header=1, chunk=2}; PushPullResponse{ack=1, params=2};
PushPullUnaryRequest{header=1, chunks=2 (repeated)}; PushPullUnaryResponse{ack=1, params=2 (repeated)}.
"""

from __future__ import annotations

from dataclasses import dataclass

_VARINT = 0
_LEN = 2


# Every key here and most small values are one byte: made once, not per message.
_ONE_BYTE = tuple(bytes((value,)) for value in range(0x80))

# The keys of the hot shapes, as bytes (field << 3 | wire type): Chunk's offset, dtype, data and
# scales, PullResponse's clock, total_length and chunk (the same bytes as Chunk's first three),
# and field 2 as a length-delimited field (PushRequest.chunk, InitRequest.chunk, PushPullResponse.params).
_OFFSET_KEY = _CLOCK_KEY = b"\x08"
_DTYPE_KEY = _TOTAL_KEY = b"\x10"
_DATA_KEY = _CHUNK_KEY = b"\x1a"
_SCALES_KEY = b"\x22"
_FIELD_2_KEY = b"\x12"


def _varint(value: int) -> bytes:
    if value < 0x80:
        if value < 0:
            raise ValueError("varints here are never negative")
        return _ONE_BYTE[value]
    # Chunk sizes and most offsets and clocks fit two or three bytes: no loop for them.
    if value < 0x4000:
        return bytes((value & 0x7F | 0x80, value >> 7))
    if value < 0x200000:
        return bytes((value & 0x7F | 0x80, value >> 7 & 0x7F | 0x80, value >> 14))
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def _chunk_header(offset: int, dtype: int, size: int) -> bytes:
    """A Chunk message's bytes up to (not including) its data."""
    head = _OFFSET_KEY + _varint(offset) if offset else b""
    if dtype:
        head += _DTYPE_KEY + _varint(dtype)
    if size:
        head += _DATA_KEY + _varint(size)
    return head


def _nest(field: int, head: bytes, size: int) -> bytes:
    """Header of a length-delimited field whose body is ``head`` followed by ``size`` more bytes."""
    return _key(field, _LEN) + _varint(len(head) + size) + head


def chunk_parts(
    field: int, offset: int, dtype: int, data: memoryview | bytes, scales: memoryview | bytes = b""
) -> tuple[memoryview | bytes, ...]:
    """The pieces of :func:`chunk_in`'s message, for a caller that joins them with more (one copy in all)."""
    size = len(data)
    head = _chunk_header(offset, dtype, size)
    if not scales:
        return (_nest(field, head, size), data)
    tail = _SCALES_KEY + _varint(len(scales))
    return (_nest(field, head, size + len(tail) + len(scales)), data, tail, scales)


def chunk_in(field: int, offset: int, dtype: int, data: memoryview | bytes, scales: memoryview | bytes = b"") -> bytes:
    """A message whose only field ``field`` is a Chunk (PushRequest.chunk or InitRequest.chunk: 2).

    ``scales`` (DTYPE_INT8_BLOCK only) follow the data, as field 4."""
    return b"".join(chunk_parts(field, offset, dtype, data, scales))


def _pull_response_head(clock: int, total_length: int, offset: int, dtype: int, size: int) -> bytes:
    head = _CLOCK_KEY + _varint(clock) if clock else b""
    if total_length:
        head += _TOTAL_KEY + _varint(total_length)
    chunk = _chunk_header(offset, dtype, size)
    return head + _CHUNK_KEY + _varint(len(chunk) + size) + chunk


def pull_response(clock: int, total_length: int, offset: int, dtype: int, data: memoryview | bytes) -> bytes:
    """A serialised PullResponse."""
    return b"".join((_pull_response_head(clock, total_length, offset, dtype, len(data)), data))


def push_pull_params(clock: int, total_length: int, offset: int, dtype: int, data: memoryview | bytes) -> bytes:
    """A serialised PushPullResponse carrying ``params`` (a PullResponse)."""
    size = len(data)
    head = _pull_response_head(clock, total_length, offset, dtype, size)
    return b"".join((_FIELD_2_KEY, _varint(len(head) + size), head, data))


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
    # Keys, dtypes and small numbers are one byte, chunk sizes and most offsets three: no loop for them.
    if position + 2 < len(buffer):
        first = buffer[position]
        if first < 0x80:
            return first, position + 1
        second = buffer[position + 1]
        if second < 0x80:
            return first & 0x7F | second << 7, position + 2
        third = buffer[position + 2]
        if third < 0x80:
            return first & 0x7F | (second & 0x7F) << 7 | third << 14, position + 3
    elif position < len(buffer) and buffer[position] < 0x80:
        return buffer[position], position + 1
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
    end = len(buffer)
    while position < end:
        # Keys, dtypes and small offsets are one byte: read inline, without a call.
        key = buffer[position]
        if key < 0x80:
            position += 1
        else:
            key, position = _read_varint(buffer, position)
        if key in (0x08, 0x10):  # offset or dtype, a varint
            if position < end and buffer[position] < 0x80:
                value = buffer[position]
                position += 1
            else:
                value, position = _read_varint(buffer, position)
            if key == 0x08:
                offset = value
            else:
                dtype = value
        elif key == 0x1A:  # data, length-delimited
            data, position = _read_bytes(buffer, position, "chunk data")
        elif key == 0x22:  # scales, length-delimited
            scales, position = _read_bytes(buffer, position, "chunk scales")
        else:
            position = _skip(buffer, position, key & 7)
    if position != end:
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
    end = len(buffer)
    body: memoryview | None = None
    try:
        while position < end:
            key, position = _read_varint(buffer, position)
            if key != 0x12:  # anything but field 2, length-delimited
                return None
            size, position = _read_varint(buffer, position)
            if position + size > end:
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


# The most fields 1 and 2 a PushPullUnary message may hold: the header (or ack) and 1,024 chunks.
# Each becomes a Python object of a few hundred bytes, so without a cap a message of 64 MiB in
# two-byte fields would take gigabytes to parse.
MAX_UNARY_FIELDS = 1025


def length_delimited_fields(data: bytes | memoryview, limit: int = MAX_UNARY_FIELDS) -> list[tuple[int, memoryview]]:
    """Fields 1 and 2 of a message whose two fields are messages (PushPullUnaryRequest and
    PushPullUnaryResponse), in the order they came, as (field number, a view of the body); other
    fields are skipped, as protobuf does with unknown ones. Each entry is the body of one message
    of the PushPull stream that the unary message stands for. More than ``limit`` of them is a
    WireError."""
    buffer = memoryview(data)
    fields: list[tuple[int, memoryview]] = []
    position = 0
    while position < len(buffer):
        key, position = _read_varint(buffer, position)
        field, wire_type = key >> 3, key & 7
        if field in (1, 2):
            if wire_type != _LEN:
                raise WireError(f"field {field} is not length-delimited")
            if len(fields) == limit:
                raise WireError(f"more than {limit} headers and chunks in one message")
            body, position = _read_bytes(buffer, position, f"field {field}")
            fields.append((field, body))
        else:
            position = _skip(buffer, position, wire_type)
    if position != len(buffer):
        raise WireError("a field runs past the end of the message")
    return fields


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


def length_delimited(field: int, data: memoryview | bytes) -> bytes:
    """One length-delimited field (a ``bytes`` or a message) as wire bytes: its key, size and data,
    in one copy of ``data``. A message of that one field is these bytes."""
    return b"".join((_key(field, _LEN), _varint(len(data)), data))
