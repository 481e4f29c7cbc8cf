"""Gap-Aware: g̃ = (g + wd θ) ⊘ G with G = 1 + |θ − θ_{b_w}| ⊘ C, then SGD or momentum SGD."""

from __future__ import annotations

import functools
import re

import pytest
import torch

from psserver.core.rules import PayloadKind, PushContext, RuleOptionError, RuleSpec, _kernels
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
    """θ_{b_w} = θ (stale by the clock but the model did not move): torch's SGD to float32 rounding.

    The compiled stale-push pass rounds as torch's vectorised kernel does; torch's own kernel
    rounds the last (length mod vector width) elements in a scalar loop, a few ulps apart."""
    rule = build_rule("gap-aware", lr=str(LR), momentum=str(momentum), weight_decay="0.01")
    params = INITIAL.clone()
    reference = torch.nn.Parameter(INITIAL.clone())
    optimizer = torch.optim.SGD([reference], lr=LR, momentum=momentum, weight_decay=0.01, fused=True)
    for gradient in (G1, G2, G3, G1):
        telemetry = apply(rule, params, gradient, context(staleness=2, snapshot=params))
        reference.grad = gradient.clone()
        optimizer.step()
        assert telemetry["scale"] == 1.0 and telemetry["gap"] == 0.0
    torch.testing.assert_close(params, reference.detach(), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_a_fresh_push_is_exactly_its_base_optimizer(momentum: float) -> None:
    """τ = 0: no gap to measure, so the push goes through torch's fused SGD kernel itself."""
    rule = build_rule("gap-aware", lr=str(LR), momentum=str(momentum), weight_decay="0.01")
    params = INITIAL.clone()
    reference = torch.nn.Parameter(INITIAL.clone())
    optimizer = torch.optim.SGD([reference], lr=LR, momentum=momentum, weight_decay=0.01, fused=True)
    for gradient in (G1, G2, G3, G1):
        telemetry = apply(rule, params, gradient, context())
        reference.grad = gradient.clone()
        optimizer.step()
        assert telemetry == {"scale": 1.0, "gap": 0.0}
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


def reference_pushes(
    options: dict[str, float | bool], params: torch.Tensor, pushes: list[tuple[torch.Tensor, torch.Tensor | None]]
) -> tuple[torch.Tensor, list[dict[str, float]]]:
    """The formula of the docstring, element by element in float64: θ after the pushes, and each telemetry."""
    lr, mu, wd, gamma, epsilon = (float(options[k]) for k in ("lr", "momentum", "weight_decay", "gamma", "epsilon"))
    eta_max = float(options["eta_max"]) or lr
    theta = params.double()
    average, buffer = torch.zeros_like(theta), torch.zeros_like(theta)
    telemetry = []
    for k, (gradient, pulled) in enumerate(pushes, start=1):
        step = buffer if mu > 0 else gradient.double()
        average = gamma * average + (1 - gamma) * step * step
        g = gradient.double() + wd * theta
        if pulled is not None:
            bound = eta_max * (torch.sqrt(average / (1 - gamma**k)) + epsilon)
            ratio = (theta - pulled.double()).abs() / bound
            if options["per_tensor"]:
                ratio = torch.cat([ratio[start:end].mean().expand(end - start) for start, end in SPANS])
            g = g / (1 + ratio)
            telemetry.append({"gap": float(ratio.mean()), "scale": float((1 / (1 + ratio)).mean())})
        else:
            telemetry.append({})
        if mu > 0:
            buffer = mu * buffer + g
            theta = theta - lr * buffer
        else:
            theta = theta - lr * g
    return theta, telemetry


SPANS = ((0, 300), (300, 301), (301, 777), (777, 1000))


@pytest.mark.parametrize("per_tensor", [False, True])
@pytest.mark.parametrize(("momentum", "weight_decay"), [(0.9, 0.0), (0.0, 0.01), (0.5, 0.001)])
def test_blocked_apply_matches_the_formula_on_random_data(
    per_tensor: bool, momentum: float, weight_decay: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several pushes of random gradients, fresh, stale and with the snapshot gone, over blocks of 128."""
    monkeypatch.setattr(_kernels, "BLOCK", 128)  # blocks that straddle the tensors
    options: dict[str, float | bool] = {
        "lr": 0.05, "momentum": momentum, "weight_decay": weight_decay, "gamma": 0.9, "epsilon": 1e-8,
        "eta_max": 0.0, "per_tensor": per_tensor,
    }  # fmt: skip
    rule = RuleSpec.parse("gap-aware", {k: str(v) for k, v in options.items()}).build(1000)
    generator = torch.Generator().manual_seed(5)
    params = torch.randn(1000, generator=generator)
    history = [params.clone()]
    pushes: list[tuple[torch.Tensor, torch.Tensor | None]] = []
    for staleness, missing in [(0, False), (2, False), (1, True), (0, False), (3, False), (1, False)]:
        gradient = torch.randn(1000, generator=generator)
        pulled = None if missing else history[max(len(history) - 1 - staleness, 0)]
        ctx = PushContext(1, staleness, PayloadKind.GRADIENT, SPANS, {}, functools.partial(lambda t: t, pulled))
        telemetry = rule.apply(params, gradient.clone(), ctx)
        pushes.append((gradient, pulled if staleness > 0 else None))
        history.append(params.clone())
        expected_theta, expected = reference_pushes(options, history[0], pushes)
        # Float32 rounding of θ, amplified where |θ − θ_{b_w}| is small against C (the op-by-op
        # implementation this replaced was as far from the float64 formula).
        torch.testing.assert_close(params, expected_theta.float(), rtol=1e-4, atol=1e-5)
        if missing:
            assert telemetry == {"scale": 1.0, "snapshot_missing": 1.0}
        elif staleness == 0:
            assert telemetry == {"scale": 1.0, "gap": 0.0}
        else:
            assert telemetry["gap"] == pytest.approx(expected[-1]["gap"], rel=1e-4)
            assert telemetry["scale"] == pytest.approx(expected[-1]["scale"], rel=1e-4)
