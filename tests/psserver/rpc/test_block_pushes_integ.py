"""8-bit pushes over real gRPC to an in-process server: applied as decoded, malformed ones refused
with their reason and nothing changed, and int8 refused where only floats go (Init, pulls)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
import pytest
import torch

from psproto import blocks, codec
from psproto.errors import Reason, reason_of
from psproto.v1 import ps_pb2, ps_pb2_grpc
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psserver.rpc.server import start_server
from tests.integration.test_protocol_integ import LAYOUT, _init, _join, _params, _push

N = LAYOUT.total_length
LR = 0.5
Stub = ps_pb2_grpc.ParameterServerStub


@pytest.fixture
def stub() -> Iterator[Stub]:
    shard = Shard(ShardConfig(RuleSpec.parse("asgd", {"lr": str(LR)})))
    running = start_server(shard, "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            yield ps_pb2_grpc.ParameterServerStub(channel)
    finally:
        running.stop(0)


def _refused(call: Callable[[], object]) -> tuple[grpc.StatusCode, Reason | None]:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    return caught.value.code(), reason_of(caught.value)


def _block_chunk(values: torch.Tensor, scales: list[float]) -> ps_pb2.Chunk:
    chunk = ps_pb2.Chunk(offset=0, dtype=ps_pb2.DTYPE_INT8_BLOCK)
    chunk.data = values.to(torch.int8).numpy().tobytes()
    chunk.scales = torch.tensor(scales, dtype=torch.float32).numpy().tobytes()
    return chunk


def test_malformed_blocks_are_refused_and_change_nothing(stub: Stub) -> None:
    worker_id = _join(stub).worker_id
    start = torch.arange(N, dtype=torch.float32)
    assert _init(stub, worker_id, start).applied
    q = torch.arange(N) - 10
    cases = [
        ([], Reason.BAD_REQUEST),  # no scale for the block
        ([0.1, 0.1], Reason.BAD_REQUEST),  # one scale too many
        ([-0.1], Reason.BAD_REQUEST),
        ([float("nan")], Reason.NON_FINITE),
        ([float("inf")], Reason.NON_FINITE),
    ]
    for push_id, (scales, reason) in enumerate(cases, start=1):
        chunks = [_block_chunk(q, scales)]
        refused = _refused(lambda: _push(stub, chunks, worker_id=worker_id, push_id=push_id))  # noqa: B023
        assert refused == (grpc.StatusCode.INVALID_ARGUMENT, reason), scales
    clock, params = _params(stub, worker_id)
    assert clock == 0 and torch.equal(params, start)
    status = stub.Status(ps_pb2.StatusRequest())
    assert status.applied_pushes == 0 and status.workers[0].pushes == 0
    assert status.rejected[Reason.BAD_REQUEST.label] == 3 and status.rejected[Reason.NON_FINITE.label] == 2

    # A well-formed 8-bit push is applied as it decodes: θ ← θ − lr · q · s.
    reply = _push(stub, [_block_chunk(q, [0.25])], worker_id=worker_id, push_id=len(cases) + 1)
    assert reply.clock == 1
    clock, params = _params(stub, worker_id)
    assert clock == 1 and torch.equal(params, start - LR * (q.float() * 0.25))


def test_a_real_gradient_is_applied_as_the_codec_decodes_it(stub: Stub) -> None:
    worker_id = _join(stub).worker_id
    assert _init(stub, worker_id, torch.zeros(N)).applied
    gradient = torch.randn(N, generator=torch.Generator().manual_seed(1))
    _push(stub, list(codec.encode(gradient, codec.INT8_BLOCK)), worker_id=worker_id)
    q, scales = blocks.encode(gradient)
    decoded = torch.empty(N)
    blocks.decode(q, scales, decoded)
    assert torch.equal(_params(stub, worker_id)[1], -LR * decoded)


def test_int8_is_refused_for_init_and_pulls(stub: Stub) -> None:
    worker_id = _join(stub).worker_id
    int8_init = list(codec.encode(torch.ones(N), codec.INT8_BLOCK))

    def init_in_int8() -> object:
        header = ps_pb2.InitRequest(header=ps_pb2.InitHeader(worker_id=worker_id, layout_hash=LAYOUT.hash))
        return stub.Init(iter([header, *(ps_pb2.InitRequest(chunk=c) for c in int8_init)]))

    assert _refused(init_in_int8) == (grpc.StatusCode.INVALID_ARGUMENT, Reason.BAD_REQUEST)
    assert not stub.Status(ps_pb2.StatusRequest()).initialized
    assert _init(stub, worker_id, torch.ones(N)).applied
    pull = ps_pb2.PullRequest(worker_id=worker_id, wire_dtype=ps_pb2.DTYPE_INT8_BLOCK)
    assert _refused(lambda: list(stub.Pull(pull))) == (grpc.StatusCode.INVALID_ARGUMENT, Reason.BAD_REQUEST)

    def push_pull_in_int8() -> object:
        header = ps_pb2.PushHeader(
            worker_id=worker_id,
            push_id=1,
            kind=ps_pb2.PAYLOAD_KIND_GRADIENT,
            layout_hash=LAYOUT.hash,
            pull_dtype=ps_pb2.DTYPE_INT8_BLOCK,
        )
        chunks = [ps_pb2.PushRequest(chunk=c) for c in codec.encode(torch.ones(N), codec.INT8_BLOCK)]
        return list(stub.PushPull(iter([ps_pb2.PushRequest(header=header), *chunks])))

    assert _refused(push_pull_in_int8) == (grpc.StatusCode.INVALID_ARGUMENT, Reason.BAD_REQUEST)
    clock, params = _params(stub, worker_id)
    assert clock == 0 and torch.equal(params, torch.ones(N))
