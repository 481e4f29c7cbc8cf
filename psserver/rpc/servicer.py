"""psproto.v1.ParameterServer over a core Shard: decode messages, call the shard, encode replies.

No parameter-server logic lives here. The handlers are coroutines on the server's event loop
(psserver.rpc.server): each call of the shard that takes its lock or computes runs on a small
pool of threads, and a call that waits in the shard (SSP, BSP, a rule's turn, a receive buffer)
awaits without holding a thread (psserver.rpc.awaiting), so no setting grows with the workers.

The four push forms (Push, PushUnary, PushPull, PushPullUnary) are thin adapters over
``Shard.push`` in its parts: the header parsed into the core's ``PushHeader``, the chunk
messages handed over as they come, the outcome turned into the reply. The one-message forms
stay because they pay for a push of one chunk: 1.15–1.23× as fast as a stream on a small
shard, on about half the worker's CPU (``benchmarks.call_forms``, docs/performance.md). A
``ShardError`` becomes its gRPC status code with a ``google.rpc.ErrorInfo`` naming its reason
(psserver.rpc.status_codes) and the shard's message.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
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
from psserver.core.receiving import PendingPush
from psserver.core.rules import PayloadKind, RuleSpec
from psserver.core.shard import PullResult, PushHeader, Shard
from psserver.core.status import WorkerView
from psserver.core.stream_watch import WatchedStream
from psserver.core.waiting import Steps
from psserver.core.workers import PushOutcome
from psserver.rpc.awaiting import ClientGone, StepRunner
from psserver.rpc.pull_encoding import PULL_RESPONSE, PUSH_PULL_PARAMS
from psserver.rpc.replication_hooks import UNREPLICATED, Replication
from psserver.rpc.status_codes import refusal, refuse

Context = grpc.aio.ServicerContext[Any, Any]
Unary = Callable[[Any, Any, Context], Coroutine[Any, Any, Any]]
Streaming = Callable[[Any, Any, Context], AsyncIterator[bytes]]


def _translate_errors(method: Unary) -> Unary:
    """Abort the RPC with the refusal's status code instead of letting it become UNKNOWN."""

    @functools.wraps(method)
    async def answered(self: ParameterServerServicer, request: Any, context: Context) -> Any:
        _Call.begin(context)
        try:
            if isinstance(request, wire.Malformed):
                raise ShardError(ErrorKind.BAD_REQUEST, f"the request could not be parsed: {request.reason}")
            return await method(self, request, context)
        except ShardError as error:
            await _abort(self.shard, error, context)

    return answered


def _translate_stream_errors(method: Streaming) -> Streaming:
    """``_translate_errors`` for a handler that streams its reply."""

    @functools.wraps(method)
    async def answered(self: ParameterServerServicer, request: Any, context: Context) -> AsyncIterator[bytes]:
        _Call.begin(context)
        try:
            if isinstance(request, wire.Malformed):
                raise ShardError(ErrorKind.BAD_REQUEST, f"the request could not be parsed: {request.reason}")
            async for message in method(self, request, context):
                yield message
        except ShardError as error:
            await _abort(self.shard, error, context)

    return answered


async def _abort(shard: Shard, error: ShardError, context: Context) -> NoReturn:
    if not error.counted:
        # Refused here, before the shard saw it (a malformed stream): still counted in Status.
        shard.count_rejected(error.kind.reason)
    await refuse(context, refusal(error.kind, error.message, error.metadata))


class _Call:
    """The running call, so a limit the shard enforces from another thread can end it.

    ``cancel`` (given to the shard for a push, an Init upload or a pull reply it watches) sends
    the call's status at once, CANCELLED with the limit's reason (the push's own refusal,
    PUSH_STALLED, when ``stalled`` says so), then cancels the handler's task, wherever it waits
    (for the next message, or for the client to read the last one)."""

    def __init__(self, context: Context) -> None:
        self._context = context
        self._task = asyncio.current_task()
        self._loop = asyncio.get_running_loop()
        # The refusal of the push this call receives, once a limit ended it (``Shard.push_stalled``).
        self.stalled: Callable[[], ShardError | None] = lambda: None
        # What the shard's waits ask (``Abandoned``); set when the client gives up (psserver.rpc.awaiting).
        self.gone = ClientGone()

    @staticmethod
    def begin(context: Context) -> _Call:
        """The call whose handler runs now (each call's task has its own context)."""
        call = _Call(context)
        _CURRENT_CALL.set(call)
        return call

    @staticmethod
    def current() -> _Call:
        return _CURRENT_CALL.get()

    def cancel(self) -> None:
        # From the shard's reaper thread.
        self._loop.call_soon_threadsafe(lambda: self._loop.create_task(self._end_for_limit()))

    async def _end_for_limit(self) -> None:
        error = self.stalled() or ShardError(
            ErrorKind.STREAM_STALLED,
            "the stream went idle or fell behind the server's minimum transfer pace (shard.transfer_pace)",
        )
        # Counted where the limit ended it (the receiver, the stream watch).
        with contextlib.suppress(Exception):
            await refuse(self._context, refusal(error.kind, error.message, error.metadata))
        if self._task is not None:
            self._task.cancel()


_CURRENT_CALL: contextvars.ContextVar[_Call] = contextvars.ContextVar("hetps_call")


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


def add_to_server(servicer: ParameterServerServicer, server: grpc.aio.Server) -> None:
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


async def _first(messages: AsyncIterator[MessageT]) -> MessageT | None:
    return await anext(aiter(messages), None)


def _next_message(messages: Iterator[bytes]) -> bytes | None:
    """The next reply message, made (encoded, maybe) with torch's ops on this thread."""
    with inline_torch_ops():
        return next(messages, None)


def _send_shard_clock(context: Context, shard: Shard) -> None:
    """The shard's clock in the reply's trailing metadata: it goes out with the call's status, in no
    frame of its own as initial metadata would. It only grows while the shard serves, so read after
    a pull it is at least the version's."""
    context.set_trailing_metadata(((metadata.SHARD_CLOCK, str(shard.clock)),))


def _joined(first: bytes, result: PullResult) -> bytes:
    return b"".join((first, *inline_each(result.messages)))


class ParameterServerServicer:
    """psproto.v1.ParameterServer; registered by ``add_to_server``."""

    def __init__(
        self,
        shard: Shard,
        runner: StepRunner,
        checkpointer: Checkpointer | None = None,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        replication: Replication = UNREPLICATED,
    ) -> None:
        """``runner`` runs the shard's calls and waits; ``max_message_bytes``: the largest message the
        server sends (a PushPullUnary reply must fit); ``replication``: what a change waits for before
        it is acknowledged (every in-sync backup holding it)."""
        self.shard = shard
        self.runner = runner
        self.checkpointer = checkpointer
        self.max_message_bytes = max_message_bytes
        self.replication = replication

    @_translate_errors
    async def Join(self, request: ps_pb2.JoinRequest, context: Context) -> ps_pb2.JoinResponse:
        reply = await self.runner.call(self._join, request)
        await self.replication.settled()
        return reply

    def _join(self, request: ps_pb2.JoinRequest) -> ps_pb2.JoinResponse:
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
    async def Init(self, request_iterator: AsyncIterator[InitMessage], context: Context) -> ps_pb2.InitResponse:
        first = await _first(request_iterator)
        if not isinstance(first, ps_pb2.InitRequest) or first.WhichOneof("body") != "header":
            raise ShardError(ErrorKind.BAD_REQUEST, "an Init stream must start with an InitHeader")
        call = self.runner.call
        assembler = await call(self.shard.begin_upload, first.header.worker_id, first.header.layout_hash)
        # Its buffer is the shard's size: a trickled or stalled upload is cancelled (stream_watch).
        watched = await call(self.shard.watch_stream, first.header.worker_id, "Init", _Call.current().cancel)
        try:
            async for message in request_iterator:
                chunk = _chunk_of(message, "Init")
                watched.moved(len(chunk.data))
                await call(self._decode_chunk, assembler, chunk)
        finally:
            watched.close()
        applied, clock = await call(self.shard.finish_upload, assembler)
        await self.replication.settled(changed=applied)
        return ps_pb2.InitResponse(applied=applied, clock=clock)

    def _decode_chunk(self, assembler: codec.Assembler, chunk: codec.ChunkLike) -> None:
        with inline_torch_ops():
            self.shard.decode_chunk(assembler, chunk)

    @_translate_stream_errors
    async def Pull(self, request: ps_pb2.PullRequest, context: Context) -> AsyncIterator[bytes]:
        """Yields already serialised PullResponse messages (registered with an identity serializer)."""
        result = await self._pull(context, request.worker_id, request.wire_dtype, PULL_RESPONSE, request.reserve)
        watched = await self.runner.call(self.shard.watch_stream, request.worker_id, "Pull", _Call.current().cancel)
        async for message in self._send(result, watched):
            yield message

    async def _send(
        self, result: PullResult, watched: WatchedStream, first: bytes | None = None
    ) -> AsyncIterator[bytes]:
        """The reply stream; it holds ``result`` until sent, so the shard counts it as a version in flight.

        Each message is counted as moved once gRPC took it (it asks for the next one only then): a
        reader that stops reading is cancelled by the shard's stream watch."""
        try:
            if first is not None:
                yield first
            messages = iter(result.messages)
            while (message := await self.runner.call(_next_message, messages)) is not None:
                yield message
                watched.moved(len(message))
        finally:
            watched.close()

    async def _pull(
        self, context: Context, worker_id: int, dtype: int, encoder: PullEncoder, exclusive: bool = False
    ) -> PullResult:
        """The shard's pull; the shard's own clock goes with the reply's status (``psproto.metadata.SHARD_CLOCK``),
        since the version may be an older one still being sent to others, whose clock is not the shard's."""
        gone = _Call.current().gone
        result = await self.runner.run(self.shard.pull_steps(worker_id, dtype, exclusive, encoder, gone), gone)
        _send_shard_clock(context, self.shard)
        return result

    async def _push(
        self, messages: AsyncIterator[PushMessage], context: Context, then_pull: bool
    ) -> tuple[PushHeader, PushOutcome]:
        """A push stream's way into the shard (``Shard.push`` in its parts): the header as plain data,
        a receive buffer (awaited when none is free), the chunks as they arrive, then the commit
        (awaiting its turn)."""
        header = _push_header(await _first(messages), then_pull)
        call = _Call.current()
        gone = call.gone
        pending = await self.runner.call(self.shard.open_push, header, call.cancel, gone)
        try:
            await self.runner.run(self.shard.take_buffer_steps(pending), gone)
            await self._receive_stream(pending, messages, call)
            outcome = await self.runner.run(self.shard.commit_steps(pending), gone)
        finally:
            # A refused chunk, a broken stream or a refused commit must not keep its receive buffer.
            self.shard.discard_push(pending)
        return header, outcome

    def _unary_push_steps(self, request: list[PushMessage], then_pull: bool, call: _Call) -> Steps[PushOutcome]:
        """A one-message push: its chunks lie in memory, so it is one run of steps (one trip to the pool
        when it need not wait)."""
        header = _push_header(request[0] if request else None, then_pull)
        chunks = [_chunk_of(message, "Push") for message in request[1:]]
        return (yield from self.shard.push_steps(header, chunks, call.cancel, call.gone))

    async def _receive_stream(self, pending: PendingPush, messages: AsyncIterator[PushMessage], call: _Call) -> None:
        # A limit that ends the push cancels its stream: the call ends with that refusal.
        call.stalled = functools.partial(self.shard.push_stalled, pending)
        async for message in messages:
            await self.runner.call(self._add_chunk, pending, _chunk_of(message, "Push"))
        call.stalled = lambda: None

    @staticmethod
    def _add_chunk(pending: PendingPush, chunk: codec.ChunkLike) -> None:
        with inline_torch_ops():
            pending.add(chunk)

    @_translate_errors
    async def Push(self, request_iterator: AsyncIterator[PushMessage], context: Context) -> ps_pb2.PushResponse:
        _, outcome = await self._push(request_iterator, context, then_pull=False)
        await self.replication.settled()
        return _push_response(outcome)

    @_translate_errors
    async def PushUnary(self, request: list[PushMessage], context: Context) -> ps_pb2.PushResponse:
        """Push in one message: the request's header and chunks are the Push stream's messages."""
        call = _Call.current()
        outcome = await self.runner.run(self._unary_push_steps(request, False, call), call.gone)
        await self.replication.settled()
        return _push_response(outcome)

    @_translate_stream_errors
    async def PushPull(self, request_iterator: AsyncIterator[PushMessage], context: Context) -> AsyncIterator[bytes]:
        """Yields serialised PushPullResponse messages: the acknowledgement, then the parameters."""
        header, outcome = await self._push(request_iterator, context, then_pull=True)
        await self.replication.settled()
        result = await self._pull(context, header.worker_id, header.pull_dtype or codec.FLOAT32, PUSH_PULL_PARAMS)
        ack = ps_pb2.PushPullResponse(ack=_push_response(outcome)).SerializeToString()
        watched = await self.runner.call(self.shard.watch_stream, header.worker_id, "PushPull", _Call.current().cancel)
        async for message in self._send(result, watched, ack):
            yield message

    @_translate_errors
    async def PushPullUnary(self, request: list[PushMessage], context: Context) -> bytes:
        """PushPull in one message each way: returns a serialised PushPullUnaryResponse (registered with an
        identity serializer), the bytes of PushPull's reply messages one after another."""
        self._refuse_unary_reply_past_limit(request)
        call = _Call.current()
        reply = await self.runner.run(self._push_pull_unary_steps(request, call), call.gone)
        await self.replication.settled()
        _send_shard_clock(context, self.shard)
        return reply

    def _push_pull_unary_steps(self, request: list[PushMessage], call: _Call) -> Steps[bytes]:
        """The push, the pull after it and the reply's bytes, as one run of steps."""
        outcome = yield from self._unary_push_steps(request, True, call)
        header = request[0]
        assert isinstance(header, ps_pb2.PushRequest)  # the push's own checks refused anything else
        dtype = header.header.pull_dtype or codec.FLOAT32
        result = yield from self.shard.pull_steps(header.header.worker_id, dtype, False, PUSH_PULL_PARAMS, call.gone)
        ack = ps_pb2.PushPullResponse(ack=_push_response(outcome)).SerializeToString()
        return _joined(ack, result)

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
    async def Heartbeat(self, request: ps_pb2.HeartbeatRequest, context: Context) -> ps_pb2.HeartbeatResponse:
        clock = await self.runner.call_brief(
            self.shard.busy, self.shard.heartbeat, request.worker_id, dict(request.stats)
        )
        return ps_pb2.HeartbeatResponse(clock=clock, lease_seconds=self.shard.config.lease_seconds)

    @_translate_errors
    async def Leave(self, request: ps_pb2.LeaveRequest, context: Context) -> ps_pb2.LeaveResponse:
        await self.runner.call_brief(self.shard.busy, self.shard.leave, request.worker_id)
        return ps_pb2.LeaveResponse()

    @_translate_errors
    async def Status(self, request: ps_pb2.StatusRequest, context: Context) -> ps_pb2.StatusResponse:
        status = await self.runner.call_brief(self.shard.busy, self.shard.status)
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
            replica=self.replication.status(),
        )

    @_translate_errors
    async def Checkpoint(self, request: ps_pb2.CheckpointRequest, context: Context) -> ps_pb2.CheckpointResponse:
        if self.checkpointer is None:
            raise ShardError(
                ErrorKind.CHECKPOINTS_OFF, "this server writes no checkpoints; start it with --checkpoint-dir DIR"
            )
        try:
            written = await self.runner.call(self.checkpointer.write_now)
        except CheckpointError as error:
            await refuse(context, refusal(ErrorKind.CHECKPOINT_FAILED, str(error)))
        return ps_pb2.CheckpointResponse(path=str(written.path), clock=written.clock)
