"""The latency interceptor on an in-process gRPC server (127.0.0.1, ephemeral port)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest
import torch

from psproto.layout import Layout
from psproto.v1 import ps_pb2, ps_pb2_grpc
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psserver.metrics import ShardMetrics
from psserver.rpc.latency import LatencyInterceptor
from psserver.rpc.security import AuthInterceptor
from psserver.rpc.server import start_server
from psserver.rpc.wrapped_handlers import AioInterceptor
from psworker.client import PSClient

SERVICE = "psproto.v1.ParameterServer"
LAYOUT = Layout.from_named_shapes([("w", (4, 4))])


@contextmanager
def serving(token: str | None = None) -> Iterator[tuple[str, ShardMetrics]]:
    """A shard served with the latency interceptor outermost, and the token check when ``token``."""
    metrics = ShardMetrics()
    shard = Shard(ShardConfig(RuleSpec.parse("asgd", {"lr": "0.1"})), observer=metrics)
    interceptors: list[AioInterceptor] = [LatencyInterceptor(metrics)]
    if token is not None:
        interceptors.append(AuthInterceptor(token))
    running = start_server(shard, "127.0.0.1:0", interceptors=interceptors)
    try:
        yield f"127.0.0.1:{running.port}", metrics
    finally:
        running.stop(0)


@pytest.fixture
def served() -> Iterator[tuple[str, ShardMetrics]]:
    with serving() as served:
        yield served


def count(metrics: ShardMetrics, method: str, code: str, expected: float | None = None) -> float:
    """The calls of ``method`` timed with ``code``. The server sends a call's status before its
    interceptors finish, so a count right after the reply may lag: with ``expected`` it is read
    until it reaches that (for at most a second), and what it reached is returned."""
    labels = {"shard": "0", "service": SERVICE, "method": method, "code": code}
    deadline = time.monotonic() + 1.0
    while True:
        value = metrics.registry.get_sample_value("hetps_rpc_duration_seconds_count", labels) or 0.0
        if expected is None or value == expected or time.monotonic() > deadline:
            return value
        time.sleep(0.01)


def test_every_kind_of_rpc_is_timed_with_its_status_code(served: tuple[str, ShardMetrics]) -> None:
    address, metrics = served
    with PSClient(address, LAYOUT, name="timed") as client:  # Join (unary)
        client.init(torch.zeros(16))  # Init (client streaming)
        client.pull(torch.empty(16))  # Pull (server streaming)
        client.push(torch.ones(16), pull_into=torch.empty(16))  # PushPullUnary (one chunk each way: unary)
        client.push(torch.ones(16))  # PushUnary (one chunk: unary)
        client.unary_push_pulls[0] = client.unary_pushes[0] = False
        client.push(torch.ones(16), pull_into=torch.empty(16))  # PushPull (both streaming)
        client.push(torch.ones(16))  # Push (client streaming)
        with pytest.raises(grpc.RpcError) as refused:
            client.sessions[0].stub.Heartbeat(ps_pb2.HeartbeatRequest(worker_id=999), timeout=5)
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    for method in ("Join", "Init", "Pull", "PushPullUnary", "PushUnary", "PushPull", "Push", "Leave"):
        assert count(metrics, method, "OK", 1) == 1, method
    assert count(metrics, "Heartbeat", "NOT_FOUND", 1) == 1
    assert count(metrics, "Heartbeat", "OK") == 0
    total = metrics.registry.get_sample_value(
        "hetps_rpc_duration_seconds_sum", {"shard": "0", "service": SERVICE, "method": "Pull", "code": "OK"}
    )
    assert total is not None and 0 < total < 5


def test_a_refused_stream_is_timed_with_its_code(served: tuple[str, ShardMetrics]) -> None:
    address, metrics = served
    with grpc.insecure_channel(address) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            list(stub.Pull(ps_pb2.PullRequest(worker_id=5), timeout=5))
        assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert count(metrics, "Pull", "NOT_FOUND", 1) == 1


@pytest.mark.parametrize(
    ("token", "credentials"),
    [(None, ()), ("secret", ()), ("secret", (("authorization", "Bearer wrong"),))],
    ids=["no-token", "token-not-sent", "token-wrong"],
)
def test_unknown_methods_mint_no_labels(token: str | None, credentials: tuple[tuple[str, str], ...]) -> None:
    """An unknown method is UNIMPLEMENTED whatever the credentials: a caller cannot make label values."""
    with serving(token) as (address, metrics), grpc.insecure_channel(address) as channel:
        for name in ("NoSuchMethod", "Made1", "Made2"):
            call = channel.unary_unary(f"/psproto.v1.ParameterServer/{name}", None, None)
            with pytest.raises(grpc.RpcError) as refused:
                call(b"", metadata=credentials, timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
    methods = {
        s.labels["method"] for family in metrics.registry.collect() for s in family.samples if "method" in s.labels
    }
    assert methods == set()


def test_calls_refused_by_the_token_check_are_timed_as_refused_between_accepted_ones() -> None:
    with serving("secret") as (address, metrics), grpc.insecure_channel(address) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        good = (("authorization", "Bearer secret"),)
        for credentials in (good, (), good, (("authorization", "Bearer wrong"),), good):
            try:
                stub.Status(ps_pb2.StatusRequest(), metadata=credentials, timeout=5)
            except grpc.RpcError as refused:
                assert credentials != good and refused.code() == grpc.StatusCode.UNAUTHENTICATED
            else:
                assert credentials == good
    assert count(metrics, "Status", "OK", 3) == 3
    assert count(metrics, "Status", "UNAUTHENTICATED", 2) == 2
