"""DyLU over real gRPC: a psserver process times two workers' pushes and assigns the slow one fewer
local steps in ``PushResponse.local_steps``, which the Python client reads off the reply."""

from __future__ import annotations

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
