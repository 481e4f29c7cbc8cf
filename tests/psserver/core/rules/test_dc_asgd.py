"""DC-ASGD: θ ← θ − η (g + λ g ⊙ g ⊙ (θ − θ_bak(w))), λ constant or λ0 / sqrt(MS + ε)."""

from __future__ import annotations

import functools
import re

import pytest
import torch

from psserver.core.rules import PayloadKind, PushContext, RuleOptionError, RuleSpec, _kernels
from tests.psserver.core.rules.conftest import INITIAL, Cluster, apply, build_rule, context

G1 = torch.tensor([1.0, 2.0, -1.0, 0.5, 0.0, 4.0])
G2 = torch.tensor([-3.0, 1.0, 2.0, 2.0, 1.0, -1.0])
G3 = torch.tensor([0.5, -0.5, 1.0, 0.0, -2.0, 1.0])


def run_stale_sequence(cluster: Cluster) -> list[dict[str, float]]:
    """a and b pull clock 0; a pushes twice (pulling in between); b's push is then two updates old."""
    a, b = cluster.join("a"), cluster.join("b")
    cluster.pull_each(a, b)
    telemetry = [cluster.push(a, G1).telemetry]
    cluster.pull(a)
    telemetry.append(cluster.push(a, G2).telemetry)
    telemetry.append(cluster.push(b, G3).telemetry)
    return telemetry


def test_constant_compensation_uses_each_workers_own_backup() -> None:
    telemetry = run_stale_sequence(cluster := Cluster("dc-asgd", lr="0.1", lambda_dc="0.5"))
    theta1 = INITIAL - 0.1 * G1
    theta2 = theta1 - 0.1 * (G2 + 0.5 * G2 * G2 * (theta1 - theta1))  # a pulled theta1: no drift
    theta3 = theta2 - 0.1 * (G3 + 0.5 * G3 * G3 * (theta2 - INITIAL))  # b's backup is the initial θ
    torch.testing.assert_close(cluster.params, theta3)
    assert telemetry[1]["gap"] == 0.0
    assert telemetry[2]["gap"] == pytest.approx(float((theta2 - INITIAL).abs().mean()))
    assert telemetry[2]["staleness"] == 2.0


def test_adaptive_compensation_scales_by_the_mean_square() -> None:
    options = {"lr": "0.1", "variant": "adaptive", "lambda0": "2", "ms_momentum": "0.5", "epsilon": "1e-7"}
    run_stale_sequence(cluster := Cluster("dc-asgd", **options))
    theta1 = INITIAL - 0.1 * G1
    theta2 = theta1 - 0.1 * G2
    mean_square = 0.5 * (0.5 * (0.5 * G1 * G1) + 0.5 * G2 * G2) + 0.5 * G3 * G3
    strength = 2 / torch.sqrt(mean_square + 1e-7)
    theta3 = theta2 - 0.1 * (G3 + strength * G3 * G3 * (theta2 - INITIAL))
    torch.testing.assert_close(cluster.params, theta3)
    torch.testing.assert_close(cluster.shard.rule.state_tensors()["mean_square"], mean_square)  # type: ignore[union-attr]


@pytest.mark.parametrize("options", [{"lambda_dc": "0"}, {"variant": "adaptive", "lambda0": "0"}])
def test_no_compensation_is_asgd(options: dict[str, str]) -> None:
    compensated = Cluster("dc-asgd", lr="0.1", **options)
    plain = Cluster("asgd", lr="0.1")
    run_stale_sequence(compensated)
    run_stale_sequence(plain)
    assert not torch.equal(compensated.params, INITIAL)
    torch.testing.assert_close(compensated.params, plain.params, rtol=0, atol=0)


def test_a_missing_backup_applies_plain_asgd_and_says_so() -> None:
    rule = build_rule("dc-asgd", lr="0.1", lambda_dc="0.5")
    params = INITIAL.clone()
    telemetry = apply(rule, params, G1, context(staleness=3, snapshot=None))
    torch.testing.assert_close(params, INITIAL - 0.1 * G1)
    assert telemetry == {"snapshot_missing": 1.0}  # an unknown gap is not reported as zero


def test_the_shard_keeps_what_each_worker_pulled() -> None:
    cluster = Cluster("dc-asgd")
    a = cluster.join()
    assert cluster.shard.rule is not None and cluster.shard.rule.needs_snapshot
    cluster.pull(a)
    stored = cluster.shard.snapshots.get(0)
    assert stored is not None
    torch.testing.assert_close(stored, INITIAL)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"variant": "fancy"}, "option variant='fancy' must be one of constant, adaptive"),
        ({"ms_momentum": "1"}, "option ms_momentum=1.0 is out of range: 0 <= value < 1"),
        ({"lambda_dc": "-0.1"}, "option lambda_dc=-0.1 is out of range: value >= 0.0"),
        ({"lambda": "0.1"}, "unknown option lambda"),
    ],
)
def test_invalid_options_are_refused(options: dict[str, str], message: str) -> None:
    with pytest.raises(RuleOptionError, match=re.escape(message)):
        RuleSpec.parse("dc-asgd", options)


@pytest.mark.parametrize("variant", ["constant", "adaptive"])
def test_blocked_apply_matches_the_formula_on_random_data(variant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several pushes of random gradients, fresh, stale and with the backup gone, over blocks of 128."""
    monkeypatch.setattr(_kernels, "BLOCK", 128)
    lr, lambda_dc, lambda0, m, epsilon = 0.05, 0.3, 0.2, 0.9, 1e-7
    options = {"lr": lr, "variant": variant, "lambda_dc": lambda_dc, "lambda0": lambda0, "ms_momentum": m}
    rule = RuleSpec.parse("dc-asgd", {k: str(v) for k, v in options.items()}).build(1000)
    generator = torch.Generator().manual_seed(7)
    params = torch.randn(1000, generator=generator)
    theta, mean_square = params.double(), torch.zeros(1000, dtype=torch.float64)
    history = [params.clone()]
    for staleness, missing in [(0, False), (2, False), (1, True), (3, False), (0, False), (1, False)]:
        gradient = torch.randn(1000, generator=generator)
        backup = None if missing else history[max(len(history) - 1 - staleness, 0)]
        ctx = PushContext(1, staleness, PayloadKind.GRADIENT, ((0, 1000),), {}, functools.partial(lambda t: t, backup))
        telemetry = rule.apply(params, gradient.clone(), ctx)
        history.append(params.clone())

        g = gradient.double()
        mean_square = m * mean_square + (1 - m) * g * g
        strength = lambda0 / torch.sqrt(mean_square + epsilon) if variant == "adaptive" else lambda_dc
        drift = theta - backup.double() if staleness > 0 and backup is not None else torch.zeros_like(theta)
        theta = theta - lr * (g + strength * g * g * drift)
        torch.testing.assert_close(params, theta.float(), rtol=1e-5, atol=1e-6)
        if missing:
            assert telemetry == {"snapshot_missing": 1.0}
        else:
            assert telemetry["gap"] == pytest.approx(float(drift.abs().mean()), rel=1e-4, abs=1e-12)
