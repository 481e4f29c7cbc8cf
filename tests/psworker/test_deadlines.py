"""Every call's deadline: a fixed allowance, its payload at a floor rate, and the server's lease for
calls the server may hold back; then that the client puts one on every call it makes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
import torch

from psproto import codec
from psproto.layout import Layout
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psserver.rpc.server import RunningServer, start_server
from psworker.channels import open_channel
from psworker.client import DeadlinePolicy, PSClient
from psworker.deadlines import payload_bytes

MB = 1_000_000


def _as_the_client_opens(client: PSClient, address: str) -> grpc.Channel:
    """A channel to ``address`` as ``client`` opens its own (for a test that wraps it)."""
    return open_channel(address, None, client.keepalive_seconds, client._single_threaded_pulls)


def test_a_call_without_payload_gets_the_fixed_allowance() -> None:
    assert DeadlinePolicy(base_seconds=7.0).short() == 7.0
    assert DeadlinePolicy(base_seconds=7.0).transfer(0) == 7.0


def test_a_payload_gets_its_size_at_the_floor_rate() -> None:
    policy = DeadlinePolicy(base_seconds=10.0, min_bytes_per_second=1 * MB)
    # The 45 MB push: 45 s for the bytes on top of the allowance.
    assert policy.transfer(45 * MB) == pytest.approx(55.0)
    assert DeadlinePolicy(base_seconds=10.0, min_bytes_per_second=9 * MB).transfer(45 * MB) == pytest.approx(15.0)


def test_a_call_the_server_may_hold_back_also_gets_the_wait() -> None:
    policy = DeadlinePolicy(base_seconds=10.0, min_bytes_per_second=1 * MB)
    assert policy.transfer(2 * MB, wait_seconds=30.0) == pytest.approx(42.0)
    assert policy.transfer(-5, wait_seconds=-1.0) == 10.0  # nothing negative shortens a deadline


def test_payload_bytes_follow_the_wire_dtype() -> None:
    assert payload_bytes(1000, codec.FLOAT32) == 4000
    assert payload_bytes(1000, codec.UNSPECIFIED) == 4000
    assert payload_bytes(1000, codec.BFLOAT16) == payload_bytes(1000, codec.FLOAT16) == 2000
    # 8-bit pushes: a byte per value and a float32 scale per block of 4096.
    assert payload_bytes(1000, codec.INT8_BLOCK) == 1004
    assert payload_bytes(10_000, codec.INT8_BLOCK) == 10_012


@pytest.mark.parametrize(("base", "rate"), [(0.0, 1.0), (1.0, 0.0), (-1.0, 1.0), (float("nan"), 1.0)])
def test_a_deadline_policy_that_could_never_be_met_is_refused(base: float, rate: float) -> None:
    with pytest.raises(ValueError, match="positive allowance and rate"):
        DeadlinePolicy(base_seconds=base, min_bytes_per_second=rate)


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
        running.server.stop(0).wait()


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
    with PSClient([served], layout, name="deadlines", wire_dtype="bf16", deadlines=policy) as client:
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
