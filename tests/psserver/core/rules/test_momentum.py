"""Naive momentum ASGD: v ← μ v + g ; θ ← θ − η v, per arrival, blind to staleness."""

from __future__ import annotations

import pytest
import torch

from psserver.core.rules import PayloadKind, PushContext, RuleSpec, _kernels
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


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("mu", [0.9, 0.0])
def test_matches_the_formula_on_random_data(fused: bool, mu: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused kernel (and its op-by-op fallback) is v ← μ v + g ; θ ← θ − η v to float32 rounding."""
    if not fused:
        monkeypatch.setattr(_kernels, "_FUSED_SGD", None)
    length, lr = 1000, 0.05
    generator = torch.Generator().manual_seed(3)
    rule = RuleSpec.parse("momentum", {"lr": str(lr), "momentum": str(mu)}).build(length)
    params = torch.randn(length, generator=generator)
    theta, velocity = params.double(), torch.zeros(length, dtype=torch.float64)
    for staleness in (0, 3, 1, 7):
        gradient = torch.randn(length, generator=generator)
        ctx = PushContext(1, staleness, PayloadKind.GRADIENT, ((0, length),))
        assert rule.apply(params, gradient.clone(), ctx) == {"scale": 1.0}
        velocity = mu * velocity + gradient.double()
        theta = theta - lr * velocity
    torch.testing.assert_close(params, theta.float(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rule.state_tensors()["velocity"], velocity.float(), rtol=1e-5, atol=1e-6)
