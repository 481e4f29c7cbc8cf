"""The bulk data path to one shard: Init, Pull, Push, PushPull and their one-message forms, hand-(de)serialised.

Chunks go out as wire bytes written straight from a slice of the caller's flat tensor
(:func:`psproto.codec.payloads`, :func:`psproto.wire.chunk_in`) and come in through
:class:`psproto.codec.Assembler` into a slice of the caller's flat buffer, so no model-sized
temporary is made on either side. Every chunk is made and taken in with torch's operations on
the thread that moves it (psproto.inline_ops): waking the intra-op pool once per chunk costs
more than the copy.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

import grpc
import torch

from psproto import codec, metadata, wire
from psproto.errors import limit_of, reason_of
from psproto.inline_ops import inline_each, inline_torch_ops
from psproto.reasons import UNARY_REPLY_LIMIT, Reason
from psproto.v1 import ps_pb2
from psworker.service import ServerMismatchError

ResultT = TypeVar("ResultT")
_SERVICE = "/psproto.v1.ParameterServer/"
# Field number of the chunk in InitRequest and PushRequest (the header is field 1).
_CHUNK_FIELD = 2


def _serialize(message: ps_pb2.PushRequest | ps_pb2.InitRequest | bytes) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()


def _push_pull_message(field: int, body: memoryview) -> ps_pb2.PushResponse | wire.PulledChunk:
    """One message of a PushPull reply: field 1 is the acknowledgement, field 2 parameters."""
    return ps_pb2.PushResponse.FromString(bytes(body)) if field == 1 else wire.parse_pull_response(body)


def _parse_push_pull(data: bytes) -> ps_pb2.PushResponse | wire.PulledChunk:
    return _push_pull_message(*wire.split_push_pull_response(data))


def _parse_push_pull_unary(data: bytes) -> list[ps_pb2.PushResponse | wire.PulledChunk]:
    """A PushPullUnaryResponse as the PushPull reply's messages it joins: the ack, then the parameters."""
    return [_push_pull_message(field, body) for field, body in wire.length_delimited_fields(data)]


class DataPath:
    """The bulk RPCs of one channel: chunks go out and come in without extra copies."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.init = channel.stream_unary(
            _SERVICE + "Init", request_serializer=_serialize, response_deserializer=ps_pb2.InitResponse.FromString
        )
        self.pull = channel.unary_stream(
            _SERVICE + "Pull",
            request_serializer=ps_pb2.PullRequest.SerializeToString,
            response_deserializer=wire.parse_pull_response,
        )
        self.push = channel.stream_unary(
            _SERVICE + "Push", request_serializer=_serialize, response_deserializer=ps_pb2.PushResponse.FromString
        )
        self.push_pull = channel.stream_stream(
            _SERVICE + "PushPull", request_serializer=_serialize, response_deserializer=_parse_push_pull
        )
        # The one-message forms' requests are built as bytes (unary_push_request).
        self.push_pull_unary = channel.unary_unary(
            _SERVICE + "PushPullUnary", request_serializer=None, response_deserializer=_parse_push_pull_unary
        )
        self.push_unary = channel.unary_unary(
            _SERVICE + "PushUnary", request_serializer=None, response_deserializer=ps_pb2.PushResponse.FromString
        )


def init_requests(
    header: ps_pb2.InitHeader, part: torch.Tensor, chunk_bytes: int = codec.DEFAULT_CHUNK_BYTES
) -> Iterator[ps_pb2.InitRequest | bytes]:
    """An Init stream: the header, then ``part`` (one shard's slice, fp32) as chunks of ``chunk_bytes``."""
    yield ps_pb2.InitRequest(header=header)
    for payload in inline_each(codec.payloads(part, codec.FLOAT32, chunk_bytes)):
        yield wire.chunk_in(_CHUNK_FIELD, payload.offset, payload.dtype, payload.data)


def push_requests(
    header: ps_pb2.PushHeader, chunks: Iterable[codec.ChunkPayload]
) -> Iterator[ps_pb2.PushRequest | bytes]:
    """A Push stream: the header, then one shard's slice as ``chunks`` (``psworker.push_encoding``)."""
    yield ps_pb2.PushRequest(header=header)
    for payload in inline_each(chunks):
        yield wire.chunk_in(_CHUNK_FIELD, payload.offset, payload.dtype, payload.data, payload.scales)


def unary_push_request(header: ps_pb2.PushHeader, chunks: Iterable[codec.ChunkPayload]) -> bytes:
    """A PushUnaryRequest or PushPullUnaryRequest (the same fields): :func:`push_requests`' messages one
    after another, each chunk's bytes copied once, straight from its tensor (``chunks`` already made)."""
    parts: list[bytes | memoryview] = [ps_pb2.PushRequest(header=header).SerializeToString()]
    for payload in chunks:
        parts += wire.chunk_parts(_CHUNK_FIELD, payload.offset, payload.dtype, payload.data, payload.scales)
    return b"".join(parts)


def _one_call_or_streams(
    unary: list[bool],
    shard: int,
    header: ps_pb2.PushHeader,
    chunks: Iterable[codec.ChunkPayload],
    timeout: float,
    one_call: Callable[[bytes, float], ResultT],
    streams: Callable[[Iterator[ps_pb2.PushRequest | bytes], float], ResultT],
) -> ResultT:
    """``one_call(request, seconds left)`` with the push as one request (:func:`unary_push_request`)
    while ``unary[shard]``, else ``streams(requests, seconds left)`` with its stream's messages. A
    server that refuses the one call (:func:`refuses_unary`) clears ``unary[shard]`` and gets the
    same push as streams at once. Either gets what is left of ``timeout`` once the chunks are made
    (an 8-bit push is encoded as they are)."""
    deadline = time.monotonic() + timeout
    if unary[shard]:
        made = list(inline_each(chunks))  # kept: sent again as streams if the call is refused
        try:
            return one_call(unary_push_request(header, made), max(deadline - time.monotonic(), 0.0))
        except grpc.RpcError as error:
            if not refuses_unary(error):
                raise
            unary[shard] = False  # before the streams: a retry of this push goes as streams too
        chunks = made
    return streams(push_requests(header, chunks), max(deadline - time.monotonic(), 0.0))


def push(
    data: DataPath,
    header: ps_pb2.PushHeader,
    chunks: Iterable[codec.ChunkPayload],
    timeout: float,
    call_metadata: tuple[tuple[str, str], ...],
    unary: list[bool],
    shard: int,
) -> ps_pb2.PushResponse:
    """A Push of shard ``shard``: as one PushUnary call while ``unary[shard]`` (:func:`unary_forms`),
    else as a stream; a refused call falls back to the stream (:func:`_one_call_or_streams`)."""

    def one_call(request: bytes, seconds: float) -> ps_pb2.PushResponse:
        reply: ps_pb2.PushResponse = data.push_unary(request, timeout=seconds, metadata=call_metadata)
        return reply

    def stream(requests: Iterator[ps_pb2.PushRequest | bytes], seconds: float) -> ps_pb2.PushResponse:
        reply: ps_pb2.PushResponse = data.push(requests, timeout=seconds, metadata=call_metadata)
        return reply

    return _one_call_or_streams(unary, shard, header, chunks, timeout, one_call, stream)


def push_pull(
    data: DataPath,
    header: ps_pb2.PushHeader,
    chunks: Iterable[codec.ChunkPayload],
    part: torch.Tensor,
    timeout: float,
    call_metadata: tuple[tuple[str, str], ...],
    unary: list[bool],
    shard: int,
) -> tuple[ps_pb2.PushResponse, int, grpc.Call]:
    """A PushPull of shard ``shard``: as one PushPullUnary call while ``unary[shard]``
    (:func:`fits_one_message`), else as two streams; a refused
    call falls back to the streams (:func:`_one_call_or_streams`). Returns the acknowledgement, the
    parameters' clock (decoded into ``part``) and the call, for its trailing metadata."""

    def one_call(request: bytes, seconds: float) -> tuple[ps_pb2.PushResponse, int, grpc.Call]:
        replies, call = data.push_pull_unary.with_call(request, timeout=seconds, metadata=call_metadata)
        return (*push_pull_reply(replies, part), call)

    def streams(
        requests: Iterator[ps_pb2.PushRequest | bytes], seconds: float
    ) -> tuple[ps_pb2.PushResponse, int, grpc.Call]:
        call = data.push_pull(requests, timeout=seconds, metadata=call_metadata)
        return (*push_pull_reply(call, part), call)

    return _one_call_or_streams(unary, shard, header, chunks, timeout, one_call, streams)


def unary_forms(
    lengths: Iterable[int], push_dtype: int, pull_dtype: int, chunk_bytes: int
) -> tuple[list[bool], list[bool]]:
    """For shards of ``lengths``: whether each one's Push goes as one PushUnary call (its push is one
    chunk), and whether its PushPull goes as one PushPullUnary call (:func:`fits_one_message`)."""
    lengths = list(lengths)
    pushes = [_one_chunk(length, push_dtype, chunk_bytes) for length in lengths]
    return pushes, [fits_one_message(length, push_dtype, pull_dtype, chunk_bytes) for length in lengths]


def _one_chunk(length: int, push_dtype: int, chunk_bytes: int) -> bool:
    return len(codec.chunk_spans(length, push_dtype, chunk_bytes)) <= 1


def fits_one_message(length: int, push_dtype: int, pull_dtype: int, chunk_bytes: int) -> bool:
    """Whether a shard of ``length`` elements pushes as one chunk and its parameters come back in at
    most ``chunk_bytes``: then a PushPull goes as a PushPullUnary call, one message each way."""
    return _one_chunk(length, push_dtype, chunk_bytes) and codec.wire_bytes(length, pull_dtype) <= chunk_bytes


def refuses_unary(error: grpc.RpcError) -> bool:
    """Whether a PushUnary or PushPullUnary failed because the server does not take one (an older server,
    another implementation) or its reply would not fit in one message: the push then goes as a stream."""
    reason = reason_of(error)
    # UNIMPLEMENTED with a reason is a refusal of the push itself (UNKNOWN_DTYPE), not of the call.
    no_such_call = error.code() == grpc.StatusCode.UNIMPLEMENTED and reason is None
    return no_such_call or (reason is Reason.LIMIT_REACHED and limit_of(error) == UNARY_REPLY_LIMIT)


def receive_params(messages: Iterable[wire.PulledChunk], part: torch.Tensor) -> int:
    """Decode pulled chunks into ``part`` (one shard's slice of a flat fp32 buffer); returns their clock."""
    assembler = codec.Assembler(part, track_finite=False)
    clock = -1
    with inline_torch_ops():
        for message in messages:
            clock = message.clock
            assembler.add(message.chunk)
    assembler.finish()
    return clock


def push_pull_reply(
    replies: Iterable[ps_pb2.PushResponse | wire.PulledChunk], part: torch.Tensor
) -> tuple[ps_pb2.PushResponse, int]:
    """Receive a PushPull's reply: its acknowledgement, then the parameters decoded into ``part`` (as
    :func:`receive_params`); returns the acknowledgement and the parameters' clock."""
    messages = iter(replies)
    ack = next(messages, None)
    if ack is None:
        raise ServerMismatchError("PushPull ended without its acknowledgement or the parameters")
    if not isinstance(ack, ps_pb2.PushResponse):
        raise ServerMismatchError("PushPull answered parameters before its acknowledgement")
    params = (message for message in messages if isinstance(message, wire.PulledChunk))
    return ack, receive_params(params, part)


def shard_clock(call: grpc.Call) -> int | None:
    """The shard's clock when it answered the pull that ``call`` is (its trailing metadata, there
    once the reply was read): at least the clock of the parameters sent, which may be an older
    version shared with other readers.

    None when the server sends none (an older server)."""
    for key, value in call.trailing_metadata() or ():
        if key == metadata.SHARD_CLOCK:
            text = value.decode() if isinstance(value, bytes) else value
            return int(text) if text.isascii() and text.isdigit() else None
    return None
