"""PSClient against a real in-process server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
import torch

from psproto.layout import Layout
from psproto.v1 import ps_pb2, ps_pb2_grpc
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psserver.rpc.server import RunningServer, start_server
from psworker.client import PSClient

LAYOUT = Layout.from_named_shapes([("w", [4])], 1)


@pytest.fixture
def served() -> Iterator[tuple[Shard, RunningServer]]:
    shard = Shard(ShardConfig(RuleSpec.parse("asgd", {"lr": "0.1"})))
    running = start_server(shard, "127.0.0.1:0")
    try:
        yield shard, running
    finally:
        running.server.stop(0).wait()


def test_a_call_refused_while_the_client_closes_does_not_join_again(served: tuple[Shard, RunningServer]) -> None:
    shard, running = served
    address = f"127.0.0.1:{running.port}"
    client = PSClient([address], LAYOUT, name="stopping")
    client.init(torch.zeros(4))
    joined = client.sessions[0].worker_id
    calls: list[int] = []
    with grpc.insecure_channel(address) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)

        def in_flight(session: object) -> None:
            calls.append(joined)
            client.close()  # Ctrl-C in the main thread: Leave, while this call is still running
            # ... and the server then refuses the call: this worker is no longer joined.
            stub.Heartbeat(ps_pb2.HeartbeatRequest(worker_id=joined), timeout=5)

        with pytest.raises(grpc.RpcError) as refused:
            client._call(0, in_flight)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert calls == [joined]  # neither retried nor joined again
    assert shard.workers == {}


def test_a_server_listed_twice_is_refused_before_any_join() -> None:
    layout = Layout.from_named_shapes([("w", (4,)), ("b", (2,))], 2)
    # Nothing listens there: the refusal must come before any connection is tried.
    with pytest.raises(ValueError, match=r"127\.0\.0\.1:9 listed more than once; give each shard.s address once"):
        PSClient(["127.0.0.1:9", "127.0.0.1:9"], layout, name="twice")
