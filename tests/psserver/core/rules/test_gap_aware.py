"""Gap-Aware: g̃ = (g + wd θ) ⊘ G with G = 1 + |θ − θ_{b_w}| ⊘ C, then SGD or momentum SGD."""

from __future__ import annotations

import re

import pytest
import torch

from psserver.core.rules import RuleOptionError, RuleSpec
from tests.psserver.core.rules.conftest import INITIAL, Cluster, apply, build_rule, context, segment_means

G1 = torch.tensor([1.0, 2.0, -1.0, 0.5, 0.0, 4.0])
G2 = torch.tensor([-3.0, 1.0, 2.0, 2.0, 1.0, -1.0])
G3 = torch.tensor([0.5, -0.5, 1.0, 0.0, -2.0, 1.0])
GAMMA, EPSILON, LR = 0.9, 1e-8, 0.1


def bound(average: torch.Tensor, steps: int, eta_max: float = LR, epsilon: float = EPSILON) -> torch.Tensor:
    """C = η_max (sqrt(v / (1 − γ^k)) + ε)."""
    return eta_max * (torch.sqrt(average / (1 - GAMMA**steps)) + epsilon)


def test_sgd_two_workers_the_stale_push_is_divided_by_its_gap() -> None:
    cluster = Cluster("gap-aware", lr=str(LR), gamma=str(GAMMA))
    a, b = cluster.join("a"), cluster.join("b")
    cluster.pull_each(a, b)
    fresh = cluster.push(a, G1)
    stale = cluster.push(b, G2)

    v1 = (1 - GAMMA) * G1 * G1  # q = g without momentum
    theta1 = INITIAL - LR * G1  # τ = 0: G = 1
    v2 = GAMMA * v1 + (1 - GAMMA) * G2 * G2
    gap = (theta1 - INITIAL).abs() / bound(v2, 2)
    theta2 = theta1 - LR * G2 / (1 + gap)
    torch.testing.assert_close(cluster.params, theta2)
    assert fresh.telemetry["scale"] == 1.0 and fresh.telemetry["gap"] == 0.0
    assert stale.telemetry["gap"] == pytest.approx(float(gap.mean()), rel=1e-5)
    assert stale.telemetry["scale"] == pytest.approx(float((1 / (1 + gap)).mean()), rel=1e-5)
    assert 0 < stale.telemetry["scale"] < 1


@pytest.mark.parametrize("per_tensor", [False, True])
def test_momentum_and_weight_decay_three_pushes(per_tensor: bool) -> None:
    mu, wd, eta_max, epsilon = 0.5, 0.01, 0.3, 0.25
    options = {
        "momentum": str(mu),
        "weight_decay": str(wd),
        "eta_max": str(eta_max),
        "epsilon": str(epsilon),
        "per_tensor": str(per_tensor),
    }
    cluster = Cluster("gap-aware", lr=str(LR), gamma=str(GAMMA), **options)
    a, b = cluster.join("a"), cluster.join("b")
    cluster.pull_each(a, b)
    cluster.push(a, G1)
    theta_a = cluster.pull(a)
    cluster.push(b, G2)  # b pulled clock 0, a clock 1: both pushes are one update old from here
    cluster.push(a, G3)

    def penalty(theta: torch.Tensor, pulled: torch.Tensor, average: torch.Tensor, steps: int) -> torch.Tensor:
        gap = (theta - pulled).abs() / bound(average, steps, eta_max, epsilon)
        return 1 + (segment_means(gap) if per_tensor else gap)

    # Push 1 (τ = 0): q is the empty buffer.
    v1 = torch.zeros(6)
    buf1 = G1 + wd * INITIAL
    theta1 = INITIAL - LR * buf1
    # Push 2 (τ = 1): q = buf1, the buffer before this push.
    v2 = GAMMA * v1 + (1 - GAMMA) * buf1 * buf1
    buf2 = mu * buf1 + (G2 + wd * theta1) / penalty(theta1, INITIAL, v2, 2)
    theta2 = theta1 - LR * buf2
    # Push 3 (τ = 1): a pulled theta1.
    v3 = GAMMA * v2 + (1 - GAMMA) * buf2 * buf2
    buf3 = mu * buf2 + (G3 + wd * theta2) / penalty(theta2, theta1, v3, 3)
    theta3 = theta2 - LR * buf3

    torch.testing.assert_close(theta_a, theta1)
    torch.testing.assert_close(cluster.params, theta3)
    state = cluster.shard.rule.state_tensors()  # type: ignore[union-attr]
    torch.testing.assert_close(state["step_average"], v3)
    torch.testing.assert_close(state["momentum_buffer"], buf3)
    assert int(state["steps"]) == 3


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_without_a_gap_it_is_its_base_optimizer(momentum: float) -> None:
    """θ_{b_w} = θ (stale by the clock but the model did not move): exactly torch's SGD."""
    rule = build_rule("gap-aware", lr=str(LR), momentum=str(momentum), weight_decay="0.01")
    params = INITIAL.clone()
    reference = torch.nn.Parameter(INITIAL.clone())
    optimizer = torch.optim.SGD([reference], lr=LR, momentum=momentum, weight_decay=0.01)
    for gradient in (G1, G2, G3, G1):
        telemetry = apply(rule, params, gradient, context(staleness=2, snapshot=params))
        reference.grad = gradient.clone()
        optimizer.step()
        assert telemetry["scale"] == 1.0 and telemetry["gap"] == 0.0
    torch.testing.assert_close(params, reference.detach(), rtol=0, atol=0)


def test_a_missing_snapshot_means_no_penalty() -> None:
    rule = build_rule("gap-aware", lr=str(LR))
    params = INITIAL.clone()
    apply(rule, params, G1, context())
    telemetry = apply(rule, params, G2, context(staleness=1, snapshot=None))
    torch.testing.assert_close(params, INITIAL - LR * G1 - LR * G2)
    assert telemetry == {"scale": 1.0, "snapshot_missing": 1.0}  # an unknown gap is not reported as zero


def test_a_larger_gap_penalises_more() -> None:
    def scale(pulled_offset: float) -> float:
        rule = build_rule("gap-aware", lr=str(LR))
        params = INITIAL.clone()
        apply(rule, params, G1, context())
        return apply(rule, params, G2, context(1, snapshot=params + pulled_offset))["scale"]

    assert 1.0 > scale(0.01) > scale(1.0) > 0.0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"gamma": "1"}, "option gamma=1.0 is out of range: 0 <= value < 1"),
        ({"momentum": "1.5"}, "option momentum=1.5 is out of range"),
        ({"per_tensor": "maybe"}, "option per_tensor='maybe' is not a valid bool"),
        ({"epsilon": "0"}, "option epsilon=0 is out of range: value > 0.0"),
    ],
)
def test_invalid_options_are_refused(options: dict[str, str], message: str) -> None:
    with pytest.raises(RuleOptionError, match=re.escape(message)):
        RuleSpec.parse("gap-aware", options)
