"""psproto.v1.ParameterServer over a core Shard: decode messages, call the shard, encode replies.

No parameter-server logic lives here. The four push forms (Push, PushUnary, PushPull,
PushPullUnary) are thin adapters over one call of ``Shard.push``: the header parsed into the
core's ``PushHeader``, the chunk messages handed over as they come, the outcome turned into the
reply. The one-message forms stay because they pay for a push of one chunk: 1.15–1.23× as fast
as a stream on a small shard, on about half the worker's CPU (``benchmarks.call_forms``,
docs/performance.md). A ``ShardError`` becomes its gRPC status code with a
``google.rpc.ErrorInfo`` naming its reason (psserver.rpc.status_codes) and the shard's message.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf.message import DecodeError

from psproto import codec, metadata, wire
from psproto.dtypes import DEFAULT_MAX_MESSAGE_BYTES
from psproto.inline_ops import inline_each, inline_torch_ops
from psproto.layout import Layout, LayoutError
from psproto.reasons import UNARY_REPLY_LIMIT
from psproto.v1 import ps_pb2
from psserver.core.checkpoint import Checkpointer, CheckpointError
from psserver.core.errors import ErrorKind, ShardError
from psserver.core.pull_versions import PullEncoder
from psserver.core.rules import PayloadKind, RuleSpec
from psserver.core.shard import PullResult, PushHeader, Shard
from psserver.core.status import WorkerView
from psserver.core.stream_watch import WatchedStream
from psserver.core.workers import PushOutcome
from psserver.rpc.pull_encoding import PULL_RESPONSE, PUSH_PULL_PARAMS
from psserver.rpc.status_codes import refusal

F = TypeVar("F", bound=Callable[..., Any])


def _translate_errors(method: F) -> F:
    """Abort the RPC with the refusal's status code instead of letting it become UNKNOWN."""

    @functools.wraps(method)
    def wrapper(self: ParameterServerServicer, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            if isinstance(request, wire.Malformed):
                raise ShardError(ErrorKind.BAD_REQUEST, f"the request could not be parsed: {request.reason}")
            result = method(self, request, context)
            if isinstance(result, Iterator):
                # Server-streaming: errors surface while iterating.
                return _guarded(result, self.shard, context)
            return result
        except ShardError as error:
            _abort(self.shard, error, context)

    return wrapper  # type: ignore[return-value]


def _abort(shard: Shard, error: ShardError, context: grpc.ServicerContext) -> NoReturn:
    if not error.counted:
        # Refused here, before the shard saw it (a malformed stream): still counted in Status.
        shard.count_rejected(error.kind.reason)
    context.abort_with_status(refusal(error.kind, error.message, error.metadata))


def _guarded(items: Iterator[Any], shard: Shard, context: grpc.ServicerContext) -> Iterator[Any]:
    try:
        yield from items
    except ShardError as error:
        _abort(shard, error, context)


def _abandoned(context: grpc.ServicerContext) -> Callable[[], bool]:
    """Whether the call's client gave up (cancelled it, or its deadline passed): a call waiting in
    the shard then ends at once and gives its server thread back (psserver.core.waiting)."""
    return lambda: not context.is_active()


# Chunk messages arrive parsed by psproto.wire (a view of the received bytes, no copy); headers
# and anything unusual go through the generated parser.
PushMessage = ps_pb2.PushRequest | wire.ChunkView | wire.Malformed
InitMessage = ps_pb2.InitRequest | wire.ChunkView | wire.Malformed


def _parse_push_request(data: bytes) -> PushMessage:
    return wire.parse_chunk_request(data) or _tolerant(ps_pb2.PushRequest.FromString)(data)


def _parse_unary_push(data: bytes) -> list[PushMessage] | wire.Malformed:
    """A PushPullUnaryRequest (or a PushUnaryRequest: the same fields) as the stream it stands for: a
    header's message, a chunk's message, in the order its fields came (psproto.wire.length_delimited_fields)."""
    try:
        return [
            ps_pb2.PushRequest(header=ps_pb2.PushHeader.FromString(bytes(body)))
            if field == 1
            else wire.parse_chunk(body)
            for field, body in wire.length_delimited_fields(data)
        ]
    except (DecodeError, ValueError) as error:  # wire.WireError is a ValueError
        return wire.Malformed(f"{len(data)} bytes are not a valid one-message push (header, then chunks): {error}")


def _parse_init_request(data: bytes) -> InitMessage:
    return wire.parse_chunk_request(data) or _tolerant(ps_pb2.InitRequest.FromString)(data)


MessageT = TypeVar("MessageT")


def _tolerant(parse: Callable[[bytes], MessageT]) -> Callable[[bytes], MessageT | wire.Malformed]:
    """A deserializer that turns bytes that are not the message into ``wire.Malformed``.

    The handler then answers INVALID_ARGUMENT saying so, instead of gRPC's generic INTERNAL."""

    def parsed(data: bytes) -> MessageT | wire.Malformed:
        try:
            return parse(data)
        except (DecodeError, ValueError, RuntimeError) as error:
            return wire.Malformed(f"{len(data)} bytes are not a valid message ({error})")

    return parsed


def _chunk_of(message: PushMessage | InitMessage, stream: str) -> wire.ChunkView | ps_pb2.Chunk:
    if isinstance(message, wire.ChunkView):
        return message
    if isinstance(message, wire.Malformed):
        raise ShardError(ErrorKind.BAD_REQUEST, f"a malformed chunk message in the {stream} stream: {message.reason}")
    if message.WhichOneof("body") != "chunk":
        raise ShardError(ErrorKind.BAD_REQUEST, f"a {stream} stream carries one header, then only chunks")
    return message.chunk


# The bytes around each message of a PushPullUnary reply (keys, lengths, clock, offsets) and the
# acknowledgement's, generously: the refusal is a guard, not an exact count.
_UNARY_REPLY_FRAMING_BYTES = 4096

# ROLE_UNSPECIFIED (a client that leaves the field out) joins as a worker.
_ROLES = frozenset({ps_pb2.ROLE_UNSPECIFIED, ps_pb2.ROLE_WORKER, ps_pb2.ROLE_OBSERVER})


def _rule_info(spec: RuleSpec, procedure_options: Mapping[str, str]) -> ps_pb2.RuleInfo:
    return ps_pb2.RuleInfo(
        name=spec.rule.name,
        options=spec.options.as_strings(),
        worker_procedure=spec.rule.worker_procedure,
        procedure_options=procedure_options,
        accepted_kinds=[ps_pb2.PayloadKind.ValueType(kind) for kind in sorted(spec.rule.accepted_kinds)],
    )


def _push_header(first: PushMessage | None, then_pull: bool) -> PushHeader:
    """A Push stream's first message as the core's header (a kind left out is a gradient)."""
    if not isinstance(first, ps_pb2.PushRequest) or first.WhichOneof("body") != "header":
        raise ShardError(ErrorKind.BAD_REQUEST, "a Push stream must start with a PushHeader")
    header = first.header
    return PushHeader(
        header.worker_id,
        header.push_id,
        header.base_clock,
        header.kind or int(PayloadKind.GRADIENT),
        header.layout_hash,
        dict(header.metadata),
        header.pull_dtype if then_pull else None,
    )


def _push_response(outcome: PushOutcome) -> ps_pb2.PushResponse:
    return ps_pb2.PushResponse(
        clock=outcome.clock,
        staleness=outcome.staleness,
        duplicate=outcome.duplicate,
        telemetry=outcome.telemetry,
        local_steps=outcome.local_steps,
    )


def _worker_status(worker: WorkerView) -> ps_pb2.WorkerStatus:
    return ps_pb2.WorkerStatus(
        worker_id=worker.worker_id,
        worker_name=worker.name,
        role=ps_pb2.ROLE_OBSERVER if worker.observer else ps_pb2.ROLE_WORKER,
        device=worker.device,
        pushes=worker.pushes,
        pulls=worker.pulls,
        duplicate_pushes=worker.duplicate_pushes,
        last_staleness=worker.last_staleness,
        mean_staleness=worker.mean_staleness,
        max_staleness=worker.max_staleness,
        seconds_since_seen=worker.seconds_since_seen,
        stats=worker.stats,
        last_telemetry=worker.last_telemetry,
    )


def add_to_server(servicer: ParameterServerServicer, server: grpc.Server) -> None:
    """Register the service like the generated helper, but Pull and the PushPulls send pre-serialised bytes."""
    handlers = {
        "Join": grpc.unary_unary_rpc_method_handler(
            servicer.Join, _tolerant(ps_pb2.JoinRequest.FromString), ps_pb2.JoinResponse.SerializeToString
        ),
        "Init": grpc.stream_unary_rpc_method_handler(
            servicer.Init, _parse_init_request, ps_pb2.InitResponse.SerializeToString
        ),
        "Pull": grpc.unary_stream_rpc_method_handler(servicer.Pull, _tolerant(ps_pb2.PullRequest.FromString), None),
        "Push": grpc.stream_unary_rpc_method_handler(
            servicer.Push, _parse_push_request, ps_pb2.PushResponse.SerializeToString
        ),
        "PushPull": grpc.stream_stream_rpc_method_handler(servicer.PushPull, _parse_push_request, None),
        "PushPullUnary": grpc.unary_unary_rpc_method_handler(servicer.PushPullUnary, _parse_unary_push, None),
        "PushUnary": grpc.unary_unary_rpc_method_handler(
            servicer.PushUnary, _parse_unary_push, ps_pb2.PushResponse.SerializeToString
        ),
        "Heartbeat": grpc.unary_unary_rpc_method_handler(
            servicer.Heartbeat,
            _tolerant(ps_pb2.HeartbeatRequest.FromString),
            ps_pb2.HeartbeatResponse.SerializeToString,
        ),
        "Leave": grpc.unary_unary_rpc_method_handler(
            servicer.Leave, _tolerant(ps_pb2.LeaveRequest.FromString), ps_pb2.LeaveResponse.SerializeToString
        ),
        "Status": grpc.unary_unary_rpc_method_handler(
            servicer.Status, _tolerant(ps_pb2.StatusRequest.FromString), ps_pb2.StatusResponse.SerializeToString
        ),
        "Checkpoint": grpc.unary_unary_rpc_method_handler(
            servicer.Checkpoint,
            _tolerant(ps_pb2.CheckpointRequest.FromString),
            ps_pb2.CheckpointResponse.SerializeToString,
        ),
    }
    service = ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"]
    missing = {m.name for m in service.methods} - set(handlers)
    assert not missing, f"RPCs without a handler: {missing}"
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))


def _send(result: PullResult, watched: WatchedStream, first: bytes | None = None) -> Iterator[bytes]:
    """The reply stream; it holds ``result`` until sent, so the shard counts it as a version in flight.

    Each message is counted as moved once the client took it (gRPC asks for the next one only
    then): a reader that stops reading is cancelled by the shard's stream watch."""
    try:
        if first is not None:
            yield first
        for message in inline_each(result.messages):
            yield message
            watched.moved(len(message))
    finally:
        watched.close()


class ParameterServerServicer:
    """psproto.v1.ParameterServer; registered by ``add_to_server``."""

    def __init__(
        self, shard: Shard, checkpointer: Checkpointer | None = None, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    ) -> None:
        """``max_message_bytes``: the largest message the server sends (a PushPullUnary reply must fit)."""
        self.shard = shard
        self.checkpointer = checkpointer
        self.max_message_bytes = max_message_bytes

    @_translate_errors
    def Join(self, request: ps_pb2.JoinRequest, context: grpc.ServicerContext) -> ps_pb2.JoinResponse:
        try:
            layout = Layout.from_proto(request.layout)
        except LayoutError as error:
            raise ShardError(ErrorKind.BAD_REQUEST, f"invalid layout: {error}") from None
        if not request.worker_name:
            raise ShardError(ErrorKind.BAD_REQUEST, "worker_name is empty; give every worker a unique name")
        if request.role not in _ROLES:
            raise ShardError(
                ErrorKind.BAD_REQUEST, f"role {request.role} is unknown; use ROLE_WORKER (1) or ROLE_OBSERVER (2)"
            )
        result = self.shard.join(
            request.worker_name,
            request.device,
            request.role == ps_pb2.ROLE_OBSERVER,
            layout,
            request.layout_hash,
            resume=request.resume,
        )
        shard_range = result.layout.shard(self.shard.config.shard_index)
        return ps_pb2.JoinResponse(
            worker_id=result.worker.worker_id,
            lease_seconds=self.shard.config.lease_seconds,
            rule=_rule_info(self.shard.config.rule, result.procedure_options),
            shard_index=self.shard.config.shard_index,
            num_shards=self.shard.config.num_shards,
            shard_offset=shard_range.offset,
            shard_length=shard_range.length,
            clock=result.clock,
            initialized=result.initialized,
            layout_hash=result.layout.hash,
        )

    @_translate_errors
    def Init(self, request_iterator: Iterator[InitMessage], context: grpc.ServicerContext) -> ps_pb2.InitResponse:
        first = next(request_iterator, None)
        if not isinstance(first, ps_pb2.InitRequest) or first.WhichOneof("body") != "header":
            raise ShardError(ErrorKind.BAD_REQUEST, "an Init stream must start with an InitHeader")
        assembler = self.shard.begin_upload(first.header.worker_id, first.header.layout_hash)
        # Its buffer is the shard's size: a trickled or stalled upload is cancelled (stream_watch).
        watched = self.shard.watch_stream(first.header.worker_id, "Init", context.cancel)
        try:
            with inline_torch_ops():
                for message in request_iterator:
                    chunk = _chunk_of(message, "Init")
                    watched.moved(len(chunk.data))
                    self.shard.decode_chunk(assembler, chunk)
        finally:
            watched.close()
        applied, clock = self.shard.finish_upload(assembler)
        return ps_pb2.InitResponse(applied=applied, clock=clock)

    @_translate_errors
    def Pull(self, request: ps_pb2.PullRequest, context: grpc.ServicerContext) -> Iterator[bytes]:
        """Yields already serialised PullResponse messages (registered with an identity serializer)."""
        result = self._pull(context, request.worker_id, request.wire_dtype, PULL_RESPONSE, request.reserve)
        return _send(result, self.shard.watch_stream(request.worker_id, "Pull", context.cancel))

    def _pull(
        self, context: grpc.ServicerContext, worker_id: int, dtype: int, encoder: PullEncoder, exclusive: bool = False
    ) -> PullResult:
        """The shard's pull; the shard's own clock goes with the reply's status (``psproto.metadata.SHARD_CLOCK``),
        since the version may be an older one still being sent to others, whose clock is not the shard's."""
        result = self.shard.pull(worker_id, dtype, exclusive, encoder, _abandoned(context))
        # Trailing: it goes out with the call's status, in no frame of its own as initial metadata would.
        # The shard's clock only grows while it serves, so read now it is at least the version's.
        context.set_trailing_metadata(((metadata.SHARD_CLOCK, str(self.shard.clock)),))
        return result

    def _push(
        self, messages: Iterator[PushMessage], context: grpc.ServicerContext, then_pull: bool
    ) -> tuple[PushHeader, PushOutcome]:
        """Every push form's way into the shard (``Shard.push``): the header as plain data, then the
        chunks as they arrive (a stream's) or as they lie in memory (a one-message call's)."""
        header = _push_header(next(messages, None), then_pull)
        chunks = (_chunk_of(message, "Push") for message in messages)
        return header, self.shard.push(header, chunks, context.cancel, _abandoned(context))

    @_translate_errors
    def Push(self, request_iterator: Iterator[PushMessage], context: grpc.ServicerContext) -> ps_pb2.PushResponse:
        _, outcome = self._push(request_iterator, context, then_pull=False)
        return _push_response(outcome)

    @_translate_errors
    def PushUnary(self, request: list[PushMessage], context: grpc.ServicerContext) -> ps_pb2.PushResponse:
        """Push in one message: the request's header and chunks are the Push stream's messages."""
        _, outcome = self._push(iter(request), context, then_pull=False)
        return _push_response(outcome)

    @_translate_errors
    def PushPull(
        self, request_iterator: Iterator[ps_pb2.PushRequest], context: grpc.ServicerContext
    ) -> Iterator[bytes]:
        """Yields serialised PushPullResponse messages: the acknowledgement, then the parameters."""
        header, outcome = self._push(request_iterator, context, then_pull=True)
        result = self._pull(context, header.worker_id, header.pull_dtype or codec.FLOAT32, PUSH_PULL_PARAMS)
        ack = ps_pb2.PushPullResponse(ack=_push_response(outcome)).SerializeToString()
        return _send(result, self.shard.watch_stream(header.worker_id, "PushPull", context.cancel), ack)

    @_translate_errors
    def PushPullUnary(self, request: list[PushMessage], context: grpc.ServicerContext) -> bytes:
        """PushPull in one message each way: returns a serialised PushPullUnaryResponse (registered with an
        identity serializer), the bytes of PushPull's reply messages one after another."""
        self._refuse_unary_reply_past_limit(request)
        header, outcome = self._push(iter(request), context, then_pull=True)
        result = self._pull(context, header.worker_id, header.pull_dtype or codec.FLOAT32, PUSH_PULL_PARAMS)
        ack = ps_pb2.PushPullResponse(ack=_push_response(outcome)).SerializeToString()
        return b"".join((ack, *inline_each(result.messages)))

    def _refuse_unary_reply_past_limit(self, request: list[PushMessage]) -> None:
        """Refuse, before anything is checked or applied, a PushPullUnary whose reply (the shard's
        parameters in the header's pull dtype) would not fit in one message: it would be applied,
        then fail to be sent. A header that is wrong, or a shard not yet initialised, is left to the
        push's own checks."""
        header = request[0] if request else None
        length = self.shard.length
        if not isinstance(header, ps_pb2.PushRequest) or header.WhichOneof("body") != "header" or not length:
            return
        pull_dtype = header.header.pull_dtype or codec.FLOAT32
        if pull_dtype not in codec.WIRE_DTYPES:
            return
        # The acknowledgement, then the parameters' messages as the shard cuts them.
        messages = 1 + len(codec.chunk_spans(length, pull_dtype, self.shard.config.chunk_bytes))
        reply_bytes = codec.wire_bytes(length, pull_dtype) + _UNARY_REPLY_FRAMING_BYTES * messages
        if reply_bytes > self.max_message_bytes:
            raise ShardError(
                ErrorKind.LIMIT_REACHED,
                f"the reply of this PushPullUnary (about {reply_bytes} bytes) would exceed the server's largest "
                f"message ({self.max_message_bytes} bytes, transport.max_message_bytes); "
                "send the push as a PushPull stream",
                metadata={"limit": UNARY_REPLY_LIMIT},
            )

    @_translate_errors
    def Heartbeat(self, request: ps_pb2.HeartbeatRequest, context: grpc.ServicerContext) -> ps_pb2.HeartbeatResponse:
        clock = self.shard.heartbeat(request.worker_id, dict(request.stats))
        return ps_pb2.HeartbeatResponse(clock=clock, lease_seconds=self.shard.config.lease_seconds)

    @_translate_errors
    def Leave(self, request: ps_pb2.LeaveRequest, context: grpc.ServicerContext) -> ps_pb2.LeaveResponse:
        self.shard.leave(request.worker_id)
        return ps_pb2.LeaveResponse()

    @_translate_errors
    def Status(self, request: ps_pb2.StatusRequest, context: grpc.ServicerContext) -> ps_pb2.StatusResponse:
        status = self.shard.status()
        config = self.shard.config
        return ps_pb2.StatusResponse(
            clock=status.clock,
            rule=_rule_info(config.rule, status.procedure_options),
            shard_index=config.shard_index,
            num_shards=config.num_shards,
            shard_length=status.shard_length,
            initialized=status.initialized,
            layout_hash=status.layout_hash,
            workers=[_worker_status(worker) for worker in status.workers],
            applied_pushes=status.applied_pushes,
            rejected=status.rejected,
            uptime_seconds=status.uptime_seconds,
        )

    @_translate_errors
    def Checkpoint(self, request: ps_pb2.CheckpointRequest, context: grpc.ServicerContext) -> ps_pb2.CheckpointResponse:
        if self.checkpointer is None:
            raise ShardError(
                ErrorKind.CHECKPOINTS_OFF, "this server writes no checkpoints; start it with --checkpoint-dir DIR"
            )
        try:
            written = self.checkpointer.write_now()
        except CheckpointError as error:
            context.abort_with_status(refusal(ErrorKind.CHECKPOINT_FAILED, str(error)))
        return ps_pb2.CheckpointResponse(path=str(written.path), clock=written.clock)
