"""Pull and PushPull send the shard's clock at admission in their trailing metadata, over real
gRPC on 127.0.0.1 (latency and drain interceptors in place).

A version stays in flight while a reply holds its result; the tests hold one themselves
(``Shard.pull`` with the transport's encoder, as the servicer does), so a later pull is
answered with that older, shared version whatever the socket buffers do.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
import torch

from psproto import codec
from psproto.layout import Layout
from psproto.metadata import SHARD_CLOCK as SHARD_CLOCK_METADATA
from psproto.v1 import ps_pb2, ps_pb2_grpc
from psserver.core.pull_versions import PullResult
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psserver.metrics import ShardMetrics
from psserver.rpc.latency import LatencyInterceptor
from psserver.rpc.pull_encoding import PULL_RESPONSE, PUSH_PULL_PARAMS, WireEncoder
from psserver.rpc.server import start_server

LAYOUT = Layout.from_named_shapes([("w", (64,))])
FP32 = ps_pb2.DTYPE_FLOAT32
SERVICE = "psproto.v1.ParameterServer"


class Served:
    """A shard with one version in flight at a time, served with the production interceptors."""

    def __init__(self, shard: Shard, stub: ps_pb2_grpc.ParameterServerStub, metrics: ShardMetrics) -> None:
        self.shard = shard
        self.stub = stub
        self.metrics = metrics
        joined = stub.Join(
            ps_pb2.JoinRequest(worker_name="w", layout=LAYOUT.to_proto(), layout_hash=LAYOUT.hash), timeout=10
        )
        self.worker_id = int(joined.worker_id)
        header = ps_pb2.InitHeader(worker_id=self.worker_id, layout_hash=LAYOUT.hash)
        chunks = (ps_pb2.InitRequest(chunk=c) for c in codec.encode(torch.zeros(64)))
        stub.Init(iter([ps_pb2.InitRequest(header=header), *chunks]), timeout=10)
        self.holder = shard.join("holder", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
        self.next_push_id = 1

    def hold_version(self, encoder: WireEncoder) -> PullResult:
        """The current version in ``encoder``'s form, kept in flight while the result is referenced."""
        return self.shard.pull(self.holder, FP32, encoder=encoder)

    def push_requests(self) -> Iterator[ps_pb2.PushRequest]:
        header = ps_pb2.PushHeader(
            worker_id=self.worker_id,
            push_id=self.next_push_id,
            base_clock=self.shard.clock,
            kind=ps_pb2.PAYLOAD_KIND_GRADIENT,
            layout_hash=LAYOUT.hash,
            pull_dtype=FP32,
        )
        self.next_push_id += 1
        yield ps_pb2.PushRequest(header=header)
        yield from (ps_pb2.PushRequest(chunk=c) for c in codec.encode(torch.ones(64)))

    def push(self) -> int:
        return int(self.stub.Push(self.push_requests(), timeout=10).clock)

    def rpcs_ok(self, method: str) -> float:
        labels = {"shard": "0", "service": SERVICE, "method": method, "code": "OK"}
        return self.metrics.registry.get_sample_value("hetps_rpc_duration_seconds_count", labels) or 0.0


@pytest.fixture
def served() -> Iterator[Served]:
    metrics = ShardMetrics()
    shard = Shard(ShardConfig(RuleSpec.parse("asgd", {"lr": "0.1"}), pull_versions=1), observer=metrics)
    running = start_server(shard, "127.0.0.1:0", interceptors=[LatencyInterceptor(metrics)])
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            yield Served(shard, ps_pb2_grpc.ParameterServerStub(channel), metrics)
    finally:
        running.stop(0)


def _shard_clock(call: grpc.Call) -> list[str]:
    return [str(value) for key, value in call.trailing_metadata() or () if key == SHARD_CLOCK_METADATA]


def test_the_key_is_the_one_the_protocol_documents() -> None:
    assert SHARD_CLOCK_METADATA == "hetps-shard-clock"


def test_a_pull_of_the_current_version_says_its_clock(served: Served) -> None:
    served.push()
    call = served.stub.Pull(ps_pb2.PullRequest(worker_id=served.worker_id, wire_dtype=FP32), timeout=10)
    assert {message.clock for message in call} == {1}
    assert _shard_clock(call) == ["1"]


def test_a_pull_answered_with_an_older_shared_version_says_the_shards_clock(served: Served) -> None:
    held = served.hold_version(PULL_RESPONSE)
    assert served.push() == 1 and served.push() == 2
    call = served.stub.Pull(ps_pb2.PullRequest(worker_id=served.worker_id, wire_dtype=FP32), timeout=10)
    assert {message.clock for message in call} == {held.clock} == {0}
    assert _shard_clock(call) == ["2"]
    assert served.rpcs_ok("Pull") == 1  # the latency interceptor saw it end normally


def test_a_push_pull_answered_with_an_older_shared_version_says_the_shards_clock(served: Served) -> None:
    held = served.hold_version(PUSH_PULL_PARAMS)
    served.push()
    call = served.stub.PushPull(served.push_requests(), timeout=10)
    replies = list(call)
    assert replies[0].WhichOneof("body") == "ack" and replies[0].ack.clock == 2
    assert {reply.params.clock for reply in replies[1:]} == {held.clock} == {0}
    assert _shard_clock(call) == ["2"]
    assert served.rpcs_ok("PushPull") == 1


def test_a_refused_pull_still_ends_with_its_refusal(served: Served) -> None:
    call = served.stub.Pull(ps_pb2.PullRequest(worker_id=999, wire_dtype=FP32), timeout=10)
    with pytest.raises(grpc.RpcError) as refused:
        list(call)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert _shard_clock(call) == []
