"""Adaptive Braking: g̃ = (1 − α c) g with c the cosine of g and v per tensor; v ← μ v + g̃ ; θ ← θ − η v."""

from __future__ import annotations

import re

import pytest
import torch

from psserver.core.rules import PayloadKind, PushContext, RuleOptionError, RuleSpec, _kernels
from tests.psserver.core.rules.conftest import INITIAL, SEGMENTS, Cluster, apply, build_rule, context

G1 = torch.tensor([1.0, 2.0, -1.0, 0.5, 0.0, 4.0])
G2 = torch.tensor([-3.0, 1.0, 2.0, 2.0, 1.0, -1.0])
G3 = torch.tensor([0.5, -0.5, 1.0, 0.0, -2.0, 1.0])
MU, LR = 0.5, 0.1


def cosine(g: torch.Tensor, v: torch.Tensor) -> float:
    if not g.any() or not v.any():
        return 0.0
    return float(g @ v / (g.norm() * v.norm() + 1e-12))


def braked(g: torch.Tensor, v: torch.Tensor, alpha: float, per_tensor: bool = True) -> tuple[torch.Tensor, list[float]]:
    """(1 − α c) g with one cosine per tensor (or one for all); returns g̃ and the cosines."""
    spans = SEGMENTS if per_tensor else ((0, len(g)),)
    out = g.clone()
    cosines = []
    for start, end in spans:
        c = cosine(g[start:end], v[start:end])
        out[start:end] *= 1 - alpha * c
        cosines.append(c)
    return out, cosines


@pytest.mark.parametrize("per_tensor", [True, False])
def test_three_pushes_from_two_workers(per_tensor: bool) -> None:
    alpha = 1.5
    granularity = "per_tensor" if per_tensor else "global"
    cluster = Cluster("adaptive-braking", lr=str(LR), momentum=str(MU), alpha=str(alpha), granularity=granularity)
    a, b = cluster.join("a"), cluster.join("b")
    cluster.pull_each(a, b)
    first = cluster.push(a, G1)
    cluster.pull(a)
    cluster.push(a, G2)
    stale = cluster.push(b, G3)

    v1 = G1  # v = 0: c = 0, no braking
    v2 = MU * v1 + braked(G2, v1, alpha, per_tensor)[0]
    g3, cosines = braked(G3, v2, alpha, per_tensor)
    v3 = MU * v2 + g3
    torch.testing.assert_close(cluster.params, INITIAL - LR * (v1 + v2 + v3))
    assert first.telemetry["cosine"] == 0.0 and first.telemetry["scale"] == 1.0
    assert stale.telemetry["cosine"] == pytest.approx(sum(cosines) / len(cosines), abs=1e-6)
    assert stale.telemetry["cosine_min"] == pytest.approx(min(cosines), abs=1e-6)
    assert stale.telemetry["scale"] == pytest.approx(1 - alpha * sum(cosines) / len(cosines), abs=1e-6)


def test_an_aligned_tensor_is_braked_and_an_opposed_one_boosted() -> None:
    rule = build_rule("adaptive-braking", lr="1.0", momentum="1.0", alpha="1.0")
    params = torch.zeros(6)
    velocity = torch.tensor([1.0, 2.0, 3.0, 4.0, 1.0, -1.0])
    apply(rule, params, velocity, context())
    # weight along v (c = 1): stopped; bias against v (c = −1): doubled.
    g = torch.tensor([2.0, 4.0, 6.0, 8.0, -1.0, 1.0])
    telemetry = apply(rule, params, g, context(staleness=3))
    expected_velocity = velocity + torch.tensor([0.0, 0.0, 0.0, 0.0, -2.0, 2.0])
    torch.testing.assert_close(rule.state_tensors()["velocity"], expected_velocity)
    torch.testing.assert_close(params, -velocity - expected_velocity)
    assert (telemetry["cosine_min"], telemetry["cosine_max"]) == pytest.approx((-1.0, 1.0))
    assert telemetry["scale"] == pytest.approx(1.0)  # mean of 0 and 2


def test_flip_sign_boosts_the_aligned_tensor() -> None:
    rule = build_rule("adaptive-braking", lr="1.0", momentum="1.0", alpha="0.5", flip_sign="true")
    params = torch.zeros(6)
    velocity = torch.tensor([1.0, 2.0, 3.0, 4.0, 1.0, -1.0])
    apply(rule, params, velocity, context())
    telemetry = apply(rule, params, 2 * velocity, context(staleness=1))
    torch.testing.assert_close(rule.state_tensors()["velocity"], velocity + 1.5 * 2 * velocity)
    assert telemetry["scale"] == pytest.approx(1.5)


def test_weight_decay_is_added_before_the_cosine() -> None:
    rule = build_rule("adaptive-braking", lr=str(LR), momentum=str(MU), weight_decay="0.1")
    params = INITIAL.clone()
    apply(rule, params, G1, context())
    theta1 = params.clone()
    apply(rule, params, G2, context(staleness=1))
    v1 = G1 + 0.1 * INITIAL
    v2 = MU * v1 + braked(G2 + 0.1 * theta1, v1, 1.0)[0]
    torch.testing.assert_close(params, INITIAL - LR * v1 - LR * v2)


def test_alpha_zero_is_momentum_asgd() -> None:
    braking = Cluster("adaptive-braking", lr=str(LR), momentum="0.9", alpha="0")
    momentum = Cluster("momentum", lr=str(LR), momentum="0.9")
    for cluster in (braking, momentum):
        a, b = cluster.join("a"), cluster.join("b")
        cluster.pull_each(a, b)
        for worker, gradient in ((a, G1), (b, G2), (a, G3), (b, -G1)):
            cluster.push(worker, gradient)
            cluster.pull(worker)
    torch.testing.assert_close(braking.params, momentum.params, rtol=0, atol=0)
    assert not torch.equal(braking.params, INITIAL)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"alpha": "2.5"}, "option alpha=2.5 is out of range: 0.0 <= value <= 2.0"),
        ({"granularity": "per_layer"}, "option granularity='per_layer' must be one of per_tensor, global"),
        ({"brake": "1"}, "unknown option brake"),
    ],
)
def test_invalid_options_are_refused(options: dict[str, str], message: str) -> None:
    with pytest.raises(RuleOptionError, match=re.escape(message)):
        RuleSpec.parse("adaptive-braking", options)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize(
    "options",
    [
        {"granularity": "per_tensor"},
        {"granularity": "global", "weight_decay": "0.01"},
        {"granularity": "per_tensor", "flip_sign": "true", "alpha": "0.5", "weight_decay": "0.001"},
    ],
)
def test_matches_the_formula_on_random_data(
    options: dict[str, str], fused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Several random pushes against the docstring's formula in float64, fused kernel or op by op."""
    if not fused:
        monkeypatch.setattr(_kernels, "_FUSED_SGD", None)
    lr, mu = 0.05, 0.9
    alpha, wd = float(options.get("alpha", "1.0")), float(options.get("weight_decay", "0"))
    sign = 1.0 if options.get("flip_sign") == "true" else -1.0
    spans = ((0, 300), (300, 300), (300, 301), (301, 1000))
    rule = RuleSpec.parse("adaptive-braking", {"lr": str(lr), "momentum": str(mu), **options}).build(1000)
    generator = torch.Generator().manual_seed(11)
    params = torch.randn(1000, generator=generator)
    theta, velocity = params.double(), torch.zeros(1000, dtype=torch.float64)
    for staleness in (0, 2, 5, 1):
        gradient = torch.randn(1000, generator=generator)
        telemetry = rule.apply(params, gradient.clone(), PushContext(1, staleness, PayloadKind.GRADIENT, spans))
        g = gradient.double() + wd * theta
        cosines = []
        for start, end in spans if options["granularity"] == "per_tensor" else ((0, 1000),):
            if end == start:
                continue
            gs, vs = g[start:end], velocity[start:end]
            norms = gs.norm() * vs.norm()
            cosine = float(gs @ vs / (norms + 1e-12)) if norms > 0 else 0.0
            g[start:end] = (1 + sign * alpha * cosine) * gs
            cosines.append(cosine)
        velocity = mu * velocity + g
        theta = theta - lr * velocity
        torch.testing.assert_close(params, theta.float(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(rule.state_tensors()["velocity"], velocity.float(), rtol=1e-5, atol=1e-6)
        assert telemetry["cosine"] == pytest.approx(sum(cosines) / len(cosines), abs=1e-6)
        assert telemetry["cosine_min"] == pytest.approx(min(cosines), abs=1e-6)
        assert telemetry["cosine_max"] == pytest.approx(max(cosines), abs=1e-6)
        expected_scale = sum(1 + sign * alpha * c for c in cosines) / len(cosines)
        assert telemetry["scale"] == pytest.approx(expected_scale, abs=1e-6)
