"""PushPullUnary and PushUnary over real gRPC to an in-process server: a generated client's call is a
PushPull in one message each way, or a Push in one message, and every request a network or a client
can send wrong is refused with its reason and nothing changed, a reply too large for one message
before the push is applied."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
import pytest
import torch

from psproto import codec
from psproto.errors import Reason, limit_of, reason_of
from psproto.layout import Layout
from psproto.reasons import UNARY_REPLY_LIMIT
from psproto.v1 import ps_pb2, ps_pb2_grpc
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psserver.rpc.server import ServerLimits, start_server
from psserver.rpc.status_codes import STATUS_CODES
from tests.integration.test_protocol_integ import LAYOUT, _init, _join, _params, _push_header, _raw

N = LAYOUT.total_length
LR = 0.5
Stub = ps_pb2_grpc.ParameterServerStub


def _served(limits: ServerLimits | None = None) -> Iterator[grpc.Channel]:
    shard = Shard(ShardConfig(RuleSpec.parse("asgd", {"lr": str(LR)})))
    running = start_server(shard, "127.0.0.1:0", limits=limits)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            yield channel
    finally:
        running.stop(0)


@pytest.fixture
def channel() -> Iterator[grpc.Channel]:
    yield from _served()


@pytest.fixture
def stub(channel: grpc.Channel) -> Stub:
    return ps_pb2_grpc.ParameterServerStub(channel)


def _refused(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value


def test_a_generated_client_pushes_and_gets_the_new_parameters_in_one_call(stub: Stub) -> None:
    worker_id = _join(stub).worker_id
    start = torch.arange(N, dtype=torch.float32)
    assert _init(stub, worker_id, start).applied
    gradient = torch.linspace(-1, 1, N)
    request = ps_pb2.PushPullUnaryRequest(
        header=_push_header(worker_id=worker_id, pull_dtype=ps_pb2.DTYPE_BFLOAT16), chunks=list(codec.encode(gradient))
    )
    reply, call = stub.PushPullUnary.with_call(request)
    assert reply.ack.clock == 1 and reply.ack.staleness == 0 and not reply.ack.duplicate
    expected = start - LR * gradient
    out = torch.empty(N)
    assembler = codec.Assembler(out, track_finite=False)
    for params in reply.params:
        assert params.clock == 1 and params.total_length == N
        assembler.add(params.chunk)
    assembler.finish()
    assert torch.equal(out, expected.to(torch.bfloat16).float())
    assert dict(call.trailing_metadata())["hetps-shard-clock"] == "1"
    clock, params = _params(stub, worker_id)
    assert clock == 1 and torch.equal(params, expected)

    # The same push id again is acknowledged as a duplicate and not applied twice.
    again = stub.PushPullUnary(request)
    assert again.ack.duplicate and again.ack.clock == 1
    clock, params = _params(stub, worker_id)
    assert clock == 1 and torch.equal(params, expected)


def test_a_generated_clients_push_unary_applies_once_and_a_repeat_is_a_duplicate(stub: Stub) -> None:
    worker_id = _join(stub).worker_id
    start = torch.arange(N, dtype=torch.float32)
    assert _init(stub, worker_id, start).applied
    gradient = torch.linspace(-1, 1, N)
    request = ps_pb2.PushUnaryRequest(header=_push_header(worker_id=worker_id), chunks=list(codec.encode(gradient)))
    ack = stub.PushUnary(request)
    assert ack.clock == 1 and ack.staleness == 0 and not ack.duplicate
    expected = start - LR * gradient
    clock, params = _params(stub, worker_id)
    assert clock == 1 and torch.equal(params, expected)
    again = stub.PushUnary(request)
    assert again.duplicate and again.clock == 1
    clock, params = _params(stub, worker_id)
    assert clock == 1 and torch.equal(params, expected)
    # Its bytes are a PushPullUnaryRequest's: the same fields.
    assert ps_pb2.PushPullUnaryRequest.FromString(request.SerializeToString()).header.push_id == 1


@pytest.mark.parametrize("method", ["PushPullUnary", "PushUnary"])
def test_each_wrong_unary_push_is_refused_with_its_reason_and_changes_nothing(
    channel: grpc.Channel, stub: Stub, method: str
) -> None:
    worker_id = _join(stub).worker_id
    start = torch.arange(N, dtype=torch.float32)
    assert _init(stub, worker_id, start).applied
    whole = _raw(0, [1.0] * N)
    mine = _push_header(worker_id=worker_id)
    header = ps_pb2.PushPullUnaryRequest(header=mine).SerializeToString()
    chunk = ps_pb2.PushPullUnaryRequest(chunks=[whole]).SerializeToString()
    cases: list[tuple[str, bytes, Reason]] = [
        ("bytes that are no message", b"\x0a\xff\x01", Reason.BAD_REQUEST),
        ("chunks without a header", chunk, Reason.BAD_REQUEST),
        ("a chunk before the header", chunk + header, Reason.BAD_REQUEST),
        ("two headers", header + header + chunk, Reason.BAD_REQUEST),
        ("a header without chunks", header, Reason.WRONG_LENGTH),
        ("more than 1,024 chunks", header + b"\x12\x00" * 1025, Reason.BAD_REQUEST),
        (
            "half the shard",
            ps_pb2.PushPullUnaryRequest(header=mine, chunks=[_raw(0, [1.0] * (N // 2))]).SerializeToString(),
            Reason.WRONG_LENGTH,
        ),
        (
            "a chunk past the end",
            ps_pb2.PushPullUnaryRequest(header=mine, chunks=[_raw(N, [1.0])]).SerializeToString(),
            Reason.CHUNK_OUT_OF_RANGE,
        ),
        (
            "a NaN in the gradient",
            ps_pb2.PushPullUnaryRequest(
                header=mine, chunks=[_raw(0, [float("nan")] + [0.0] * (N - 1))]
            ).SerializeToString(),
            Reason.NON_FINITE,
        ),
        (
            "an unknown worker",
            ps_pb2.PushPullUnaryRequest(
                header=_push_header(worker_id=worker_id + 99), chunks=[whole]
            ).SerializeToString(),
            Reason.UNKNOWN_WORKER,
        ),
    ]
    # PushUnaryRequest has PushPullUnaryRequest's fields: the same bytes go to either call.
    raw = channel.unary_unary(f"/psproto.v1.ParameterServer/{method}")
    for what, request, reason in cases:
        error = _refused(lambda: raw(request, timeout=5))  # noqa: B023
        assert reason_of(error) is reason, (what, error.details())
        assert error.code() == STATUS_CODES[reason], what
    clock, params = _params(stub, worker_id)
    assert clock == 0 and torch.equal(params, start)
    status = stub.Status(ps_pb2.StatusRequest())
    assert status.applied_pushes == 0 and status.workers[0].pushes == 0


def test_a_reply_past_the_largest_message_is_refused_before_the_push_is_applied() -> None:
    # An 8-bit push of this shard fits in 64 KiB; its fp32 reply (80,000 bytes) does not.
    layout_length = 20_000
    for channel in _served(ServerLimits(max_message_bytes=64 * 1024)):
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        layout = Layout.from_named_shapes([("w", (layout_length,))])
        worker_id = _join(stub, layout=layout).worker_id
        init = [ps_pb2.InitRequest(header=ps_pb2.InitHeader(worker_id=worker_id, layout_hash=layout.hash))]
        init += [ps_pb2.InitRequest(chunk=c) for c in codec.encode(torch.zeros(layout_length), chunk_bytes=32 * 1024)]
        assert stub.Init(iter(init)).applied
        header = _push_header(worker_id=worker_id)
        header.layout_hash = layout.hash
        request = ps_pb2.PushPullUnaryRequest(
            header=header, chunks=list(codec.encode(torch.ones(layout_length), codec.INT8_BLOCK))
        )
        assert request.ByteSize() < 64 * 1024
        error = _refused(lambda: stub.PushPullUnary(request, timeout=5))  # noqa: B023
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert reason_of(error) is Reason.LIMIT_REACHED and limit_of(error) == UNARY_REPLY_LIMIT
        assert "send the push as a PushPull stream" in (error.details() or "")
        status = stub.Status(ps_pb2.StatusRequest())
        assert status.applied_pushes == 0 and status.clock == 0
