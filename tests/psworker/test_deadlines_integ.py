"""The client puts a deadline sized to its payload on every call it makes to a served shard."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
import torch

from psproto.layout import Layout
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psserver.rpc.server import RunningServer, start_server
from psworker.channels import open_channel
from psworker.client import ClientConfig, DeadlinePolicy, PSClient
from tests.psworker.test_deadlines import MB


def _as_the_client_opens(client: PSClient, address: str) -> grpc.Channel:
    """A channel to ``address`` as ``client`` opens its own (for a test that wraps it)."""
    return open_channel(address, None, client.keepalive_seconds, client._single_threaded_pulls)


class _Recorder(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamStreamClientInterceptor,  # type: ignore[type-arg]
):
    """Records each call's method and deadline (seconds from the call's start)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float | None]] = []

    def _record(self, continuation: Callable[..., Any], details: grpc.ClientCallDetails, request: Any) -> Any:
        self.calls.append((details.method.rpartition("/")[2], details.timeout))
        return continuation(details, request)

    intercept_unary_unary = intercept_unary_stream = _record
    intercept_stream_unary = intercept_stream_stream = _record


@pytest.fixture
def served() -> Iterator[str]:
    shard = Shard(ShardConfig(RuleSpec.parse("asgd", {"lr": "0.1"}), lease_seconds=12.0))
    running: RunningServer = start_server(shard, "127.0.0.1:0")
    try:
        yield f"127.0.0.1:{running.port}"
    finally:
        running.stop(0)


def test_the_client_puts_a_deadline_sized_to_its_payload_on_every_call(
    served: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    length = 250_000  # 1 MB in fp32, 0.5 MB in bf16
    layout = Layout.from_named_shapes([("w", [length])], 1)
    recorder = _Recorder()

    def channel(self: PSClient, address: str) -> grpc.Channel:
        return grpc.intercept_channel(_as_the_client_opens(self, address), recorder)

    monkeypatch.setattr(PSClient, "_channel", channel)
    policy = DeadlinePolicy(base_seconds=5.0, min_bytes_per_second=0.5 * MB)
    with PSClient(
        [served], layout, name="deadlines", config=ClientConfig(wire_dtype="bf16", deadlines=policy)
    ) as client:
        client.init(torch.zeros(length))
        client.pull(torch.empty(length))
        client.push(torch.ones(length))  # one chunk: PushUnary
        client.push(torch.ones(length), pull_into=torch.empty(length))  # one chunk each way: PushPullUnary
        client.unary_push_pulls[0] = client.unary_pushes[0] = False
        client.push(torch.ones(length))
        client.push(torch.ones(length), pull_into=torch.empty(length))
        client.heartbeat({})
        client.status()
    deadlines = dict(recorder.calls)
    assert all(timeout is not None for _, timeout in recorder.calls), recorder.calls
    methods = {"Join", "Init", "Pull", "Push", "PushUnary", "PushPull", "PushPullUnary", "Heartbeat", "Status", "Leave"}
    assert methods <= set(deadlines)
    assert deadlines["Init"] == pytest.approx(5.0 + 2.0, abs=0.1)  # 1 MB of fp32 at 0.5 MB/s
    assert deadlines["Pull"] == pytest.approx(5.0 + 1.0 + 12.0, abs=0.1)  # bf16 and the lease
    assert deadlines["Push"] == pytest.approx(5.0 + 1.0 + 12.0, abs=0.1)
    assert deadlines["PushPull"] == pytest.approx(5.0 + 2.0 + 12.0, abs=0.1)  # both directions
    assert deadlines["PushPullUnary"] == pytest.approx(deadlines["PushPull"], abs=0.1)
    assert deadlines["PushUnary"] == pytest.approx(deadlines["Push"], abs=0.1)
    assert deadlines["Heartbeat"] == deadlines["Status"] == pytest.approx(5.0, abs=0.1)
