"""DynSGD: θ ← θ + Δ / (τ + 1) for a delta, θ ← θ − η g / (τ + 1) for a gradient."""

from __future__ import annotations

import pytest
import torch

from psserver.core.rules import PayloadKind
from tests.psserver.core.rules.conftest import INITIAL, Cluster, Worker

D1 = torch.tensor([0.25, 0.0, -0.5, 1.0, 2.0, 0.0])
D2 = torch.tensor([-1.0, 0.5, 0.5, 0.0, -0.25, 1.0])
D3 = torch.tensor([2.0, -1.0, 0.0, 1.5, 1.0, -3.0])


def test_deltas_are_divided_by_staleness_plus_one() -> None:
    cluster = Cluster("dynsgd")
    a, b = cluster.join("a"), cluster.join("b")
    cluster.pull_each(a, b)
    cluster.push(a, D1, PayloadKind.DELTA)
    cluster.pull(a)
    cluster.push(a, D2, PayloadKind.DELTA)
    stale = cluster.push(b, D3, PayloadKind.DELTA)  # τ = 2
    torch.testing.assert_close(cluster.params, INITIAL + D1 + D2 + D3 / 3)
    assert stale.telemetry["scale"] == pytest.approx(1 / 3)


def test_gradients_take_the_lambda_one_form() -> None:
    cluster = Cluster("dynsgd", lr="0.4")
    a, b = cluster.join("a"), cluster.join("b")
    cluster.pull_each(a, b)
    cluster.push(a, D1)
    stale = cluster.push(b, D2)  # τ = 1
    torch.testing.assert_close(cluster.params, INITIAL - 0.4 * D1 - 0.4 * D2 / 2)
    assert stale.telemetry["scale"] == 0.5


def test_the_worker_pushes_its_window_delta() -> None:
    cluster = Cluster("dynsgd", lr="0.5", window="1")
    a, b = Worker(cluster, "a"), Worker(cluster, "b")
    g = torch.tensor([1.0, 0.0, 2.0, -1.0, 0.5, 1.0])
    a.step(g)  # fresh: the whole step
    b.step(g)  # b pulled before a's push: τ = 1, half the step
    torch.testing.assert_close(cluster.params, INITIAL - 0.5 * g - 0.5 * g / 2)
