"""Naive momentum ASGD: v ← μ v + g ; θ ← θ − η v, per arrival, blind to staleness."""

from __future__ import annotations

import torch

from tests.psserver.core.rules.conftest import INITIAL, Cluster

G1 = torch.tensor([1.0, 2.0, -1.0, 0.5, 0.0, 4.0])
G2 = torch.tensor([-3.0, 1.0, 2.0, 2.0, 1.0, -1.0])
G3 = torch.tensor([0.5, -0.5, 1.0, 0.0, -2.0, 1.0])


def test_three_pushes_from_two_workers() -> None:
    cluster = Cluster("momentum", lr="0.1", momentum="0.5")
    a, b = cluster.join("a"), cluster.join("b")
    cluster.pull_each(a, b)
    cluster.push(a, G1)
    cluster.pull(a)
    cluster.push(a, G2)
    stale = cluster.push(b, G3)  # two updates old

    v1 = G1
    v2 = 0.5 * v1 + G2
    v3 = 0.5 * v2 + G3
    expected = INITIAL - 0.1 * v1 - 0.1 * v2 - 0.1 * v3
    torch.testing.assert_close(cluster.params, expected)
    torch.testing.assert_close(cluster.shard.rule.state_tensors()["velocity"], v3)  # type: ignore[union-attr]
    assert stale.staleness == 2
