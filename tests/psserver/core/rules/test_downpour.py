"""Windowed DOWNPOUR: the server adds each worker's accumulated delta, θ ← θ + Δ."""

from __future__ import annotations

import pytest
import torch

from psserver.core.errors import ErrorKind, ShardError
from psserver.core.rules import PayloadKind, RuleOptionError, RuleSpec
from tests.psserver.core.rules.conftest import INITIAL, Cluster, Worker

D1 = torch.tensor([0.25, 0.0, -0.5, 1.0, 2.0, 0.0])
D2 = torch.tensor([-1.0, 0.5, 0.5, 0.0, -0.25, 1.0])


def test_deltas_from_two_workers_are_added_whatever_their_staleness() -> None:
    cluster = Cluster("downpour")
    a, b = cluster.join("a"), cluster.join("b")
    cluster.pull_each(a, b)
    cluster.push(a, D1, PayloadKind.DELTA)
    stale = cluster.push(b, D2, PayloadKind.DELTA)
    torch.testing.assert_close(cluster.params, INITIAL + D1 + D2)
    assert stale.staleness == 1 and stale.telemetry["scale"] == 1.0


def test_gradients_are_refused() -> None:
    cluster = Cluster("downpour")
    a = cluster.join()
    cluster.pull(a)
    with pytest.raises(ShardError) as refused:
        cluster.push(a, D1, PayloadKind.GRADIENT)
    assert refused.value.kind is ErrorKind.BAD_REQUEST
    assert "worker procedure 'delta'" in refused.value.message


def test_the_worker_runs_lambda_local_sgd_steps_and_pushes_their_sum() -> None:
    cluster = Cluster("downpour", lr="0.5", window="2")
    worker = Worker(cluster, "a")
    assert worker.client.rule.procedure_options == {"lr": "0.5", "window": "2"}
    g1 = torch.tensor([1.0, 0.0, 2.0, -1.0, 0.5, 1.0])
    g2 = torch.tensor([0.0, 4.0, -2.0, 1.0, 0.5, 3.0])
    worker.step(g1)
    torch.testing.assert_close(cluster.params, INITIAL)  # nothing pushed inside a window
    worker.step(g2)
    torch.testing.assert_close(cluster.params, INITIAL - 0.5 * g1 - 0.5 * g2)
    torch.testing.assert_close(worker.local, cluster.params)


def test_a_window_below_one_is_refused() -> None:
    with pytest.raises(RuleOptionError, match="option window=0 is out of range: value >= 1"):
        RuleSpec.parse("downpour", {"window": "0"})
