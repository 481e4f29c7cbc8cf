"""DyLU over real gRPC: a psserver process times two workers' pushes and assigns the slow one fewer
local steps in ``PushResponse.local_steps``, which the Python client reads off the reply."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from psproto.layout import Layout
from psproto.v1 import ps_pb2
from psworker.client import PSClient
from tests.integration.conftest import StartServer

pytestmark = pytest.mark.integration

LAYOUT = Layout.from_named_shapes([("w", (2, 2)), ("b", (2,))])
DELTA = torch.full((6,), 0.01)


def test_push_replies_carry_the_assigned_local_steps(start_psserver: StartServer) -> None:
    address = start_psserver(rule="diloco", rule_opts=("window=4", "dylu=true"))
    with PSClient(address, LAYOUT, name="fast") as fast, PSClient(address, LAYOUT, name="slow") as slow:
        fast.init(torch.zeros(6))
        params = torch.empty(6)

        def push(client: PSClient) -> int:
            client.pull(params)
            (result,) = client.push(DELTA, ps_pb2.PAYLOAD_KIND_DELTA, {"steps_done": 4.0})
            return result.local_steps

        # First pushes only start each worker's measurement: the rule's window comes back.
        assert push(fast) == 4 and push(slow) == 4
        time.sleep(0.1)
        assert push(fast) == 4  # 4 steps in ~0.1 s: the fastest, v_ref
        time.sleep(0.4)
        # 4 steps in ~0.5 s against ~0.1 s: floor(v_slow / v_fast × 4) = 0 or 1, at least dylu_min = 1.
        assert push(slow) == 1


def test_without_dylu_the_field_is_zero(start_psserver: StartServer) -> None:
    address = start_psserver(rule="downpour", rule_opts=("window=4",))
    with PSClient(address, LAYOUT, name="worker") as client:
        client.init(torch.zeros(6))
        client.pull(torch.empty(6))
        (result,) = client.push(DELTA, ps_pb2.PAYLOAD_KIND_DELTA, {"steps_done": 4.0})
        assert result.local_steps == 0 and "local_steps" not in result.telemetry


def test_pull_grace_holds_a_push_pull_until_the_other_workers_push_lands(start_psserver: StartServer) -> None:
    # diloco-dn with pull_grace: once the shard knows both workers' paces, a worker whose push
    # lands while the other is due gets its parameters only after the other's push is applied.
    address = start_psserver(rule="diloco-dn", rule_opts=("window=4", "period=2", "pull_grace=1.2"))
    with PSClient(address, LAYOUT, name="a") as first, PSClient(address, LAYOUT, name="b") as second:
        first.init(torch.zeros(6))
        params = torch.empty(6)
        for client in (first, second):
            client.pull(params)
        for _ in range(2):  # two windows of 1.5 s each: the shard measures both paces
            time.sleep(1.5)
            for client in (first, second):
                client.push(DELTA, ps_pb2.PAYLOAD_KIND_DELTA, {"steps_done": 4.0}, pull_into=params)
        time.sleep(1.5)
        clocks: list[int] = []
        began = time.monotonic()

        def push_pull() -> None:
            (result,) = first.push(DELTA, ps_pb2.PAYLOAD_KIND_DELTA, {"steps_done": 4.0}, pull_into=params)
            clocks.extend((result.clock, first.clock))

        thread = threading.Thread(target=push_pull)
        thread.start()
        time.sleep(0.4)  # "b" is due now; "a" waits for it, for at most the 1.2 s grace
        assert thread.is_alive()
        second.push(DELTA, ps_pb2.PAYLOAD_KIND_DELTA, {"steps_done": 4.0}, pull_into=torch.empty(6))
        thread.join(10)
        assert not thread.is_alive() and time.monotonic() - began >= 0.4
        assert clocks == [5, 6]  # its push was the 5th; the parameters it got include the 6th
