"""The D = 32 learning-rate sweep's verdict: each variant at its own best rate against the best undelayed run."""

from __future__ import annotations

from experiments.repro_ab_sweep import DIGITS_SWEEP, REFERENCE, VARIANTS, ab_sweep_experiment, best_rate
from experiments.repro_common import Aggregates


def _aggregates(accuracy: dict[str, dict[float, float]]) -> Aggregates:
    return {
        (series, lr): {"mean": value, "std": 0.002, "values": [value], "telemetry": {}}
        for series, by_lr in accuracy.items()
        for lr, value in by_lr.items()
    }


def test_the_sweep_runs_every_variant_delayed_and_the_reference_undelayed() -> None:
    exp = ab_sweep_experiment(DIGITS_SWEEP)
    delayed = [p for p in exp.points if p.series in VARIANTS]
    assert {p.config.delay for p in delayed} == {32}
    assert len(delayed) == len(VARIANTS) * len(DIGITS_SWEEP.lrs)
    reference = [p for p in exp.points if p.series == REFERENCE]
    assert {p.config.delay for p in reference} == {0} and {p.config.rule for p in reference} == {"momentum"}
    assert {p.config.options["lr"] for p in delayed} == {f"{lr:g}" for lr in DIGITS_SWEEP.lrs}


def test_ab_within_two_points_at_its_best_rate_where_momentum_collapses_is_reproduced() -> None:
    exp = ab_sweep_experiment(DIGITS_SWEEP)
    agg = _aggregates(
        {
            REFERENCE: {0.05: 0.98, 0.01: 0.97},
            "momentum ASGD": {0.05: 0.10, 0.005: 0.40},
            "AB α=1": {0.05: 0.10, 0.005: 0.97},
            "AB α=2": {0.05: 0.10, 0.005: 0.90},
        }
    )
    assert best_rate(agg, "AB α=1") == 0.005
    verdict, text = exp.judge(agg)
    assert verdict == "reproduced"
    assert "AB α=1 at its best rate 0.005: 0.970" in text


def test_ab_that_helps_but_still_loses_much_is_partly_and_no_help_is_not_reproduced() -> None:
    exp = ab_sweep_experiment(DIGITS_SWEEP)
    helps = {REFERENCE: {0.01: 0.97}, "momentum ASGD": {0.01: 0.10}, "AB α=1": {0.01: 0.80}, "AB α=2": {0.01: 0.70}}
    assert exp.judge(_aggregates(helps))[0] == "partly"
    none = {REFERENCE: {0.01: 0.97}, "momentum ASGD": {0.01: 0.10}, "AB α=1": {0.01: 0.10}, "AB α=2": {0.01: 0.101}}
    assert exp.judge(_aggregates(none))[0] == "not reproduced"
