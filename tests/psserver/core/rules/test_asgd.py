"""ASGD: θ ← θ − η g for a gradient, θ ← θ + Δ for a delta, whatever the staleness."""

from __future__ import annotations

import torch

from psserver.core.rules import PayloadKind
from tests.psserver.core.rules.conftest import INITIAL, Cluster

G1 = torch.tensor([1.0, 2.0, -1.0, 0.5, 0.0, 4.0])
G2 = torch.tensor([-3.0, 1.0, 2.0, 2.0, 1.0, -1.0])
DELTA = torch.tensor([0.25, 0.0, -0.5, 1.0, 2.0, 0.0])


def test_two_workers_with_different_base_clocks() -> None:
    cluster = Cluster("asgd", lr="0.5")
    a, b = cluster.join("a"), cluster.join("b")
    cluster.pull_each(a, b)
    first = cluster.push(a, G1)
    second = cluster.push(b, G2)  # computed on clock 0, applied at clock 1
    cluster.pull(a)
    third = cluster.push(a, DELTA, PayloadKind.DELTA)

    expected = INITIAL - 0.5 * G1 - 0.5 * G2 + DELTA
    torch.testing.assert_close(cluster.params, expected)
    assert [first.staleness, second.staleness, third.staleness] == [0, 1, 0]
    assert second.telemetry == {"staleness": 1.0, "scale": 1.0}
