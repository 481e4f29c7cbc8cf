"""DyLU's bookkeeping (psserver.core.local_steps): Eq. 6, the reference speed, speeds from push timing."""

from __future__ import annotations

import pytest

from psserver.core.consistency import Consistency, ConsistencyModel
from psserver.core.local_steps import (
    DYLU_UNDER_BSP,
    SPEED_SMOOTHING,
    DyluSettings,
    LocalSteps,
    assigned_steps,
    dylu_refusal,
    reference_speed,
)
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psserver.core.workers import WorkerRecord


def _workers(*ids: int) -> list[WorkerRecord]:
    return [WorkerRecord(worker_id, f"w{worker_id}", "cpu", False) for worker_id in ids]


def _settings(window: int = 8, minimum: int = 1, reference: str = "max") -> DyluSettings:
    return DyluSettings(window, minimum, reference)


def test_eq6_scales_the_window_by_the_speed_ratio_rounding_down() -> None:
    assert assigned_steps(4.0, 4.0, 8, 1) == 8  # the reference worker takes H
    assert assigned_steps(2.0, 4.0, 8, 1) == 4
    assert assigned_steps(1.0, 4.0, 8, 1) == 2
    assert assigned_steps(3.0, 4.0, 10, 1) == 7  # floor(7.5)
    # A ratio measured a hair low still gives the integer it stands for.
    assert assigned_steps(0.25 - 1e-15, 1.0, 20, 1) == 5


def test_h_min_is_the_floor_of_the_assignment() -> None:
    assert assigned_steps(1.0, 100.0, 8, 1) == 1  # floor(0.08) = 0, raised to h_min = 1
    assert assigned_steps(1.0, 4.0, 8, 3) == 3  # floor(2) = 2 < h_min = 3
    assert assigned_steps(2.0, 4.0, 8, 3) == 4  # above h_min: Eq. 6 as is


def test_an_unknown_speed_gets_the_rules_window() -> None:
    assert assigned_steps(None, 4.0, 8, 1) == 8
    assert assigned_steps(2.0, None, 8, 1) == 8


def test_reference_speed_max_and_p90() -> None:
    speeds = [1.0, 1.0, 2.0, 4.0]
    assert reference_speed(speeds, "max") == 4.0
    # 90th percentile, linear between ranks: position 0.9 × 3 = 2.7 → 2 + 0.7 × (4 − 2).
    assert reference_speed(speeds, "p90") == pytest.approx(3.4)
    assert reference_speed([5.0], "p90") == 5.0
    assert reference_speed([], "max") is None
    with pytest.raises(ValueError, match="unknown DyLU reference"):
        reference_speed(speeds, "p50")


def test_speeds_come_from_the_time_between_a_push_applied_and_the_next_header() -> None:
    steps = LocalSteps(_settings(window=8))
    live = _workers(1, 2)
    # Worker 1's first push only starts the measurement: H until its speed is known.
    steps.observe(1, header_at=0.0, steps_done=8.0, now=0.5, live=live)
    assert steps.speed(1) is None and steps.assigned(1) == 8
    steps.observe(2, header_at=0.0, steps_done=8.0, now=0.0, live=live)
    # 8 steps between 0.5 (its push applied) and 4.5 (its next header): 2 steps/s.
    steps.observe(1, header_at=4.5, steps_done=8.0, now=5.0, live=live)
    assert steps.speed(1) == pytest.approx(2.0) and steps.assigned(1) == 8  # the only known speed: v_ref
    steps.observe(2, header_at=16.0, steps_done=8.0, now=16.0, live=live)
    assert steps.speed(2) == pytest.approx(0.5)
    assert steps.assigned(2) == 2 and steps.assigned(1) == 8  # floor(0.5 / 2 × 8)
    # Worker 2 follows: 2 steps in 4 s, the same speed; its assignment stays.
    steps.observe(2, header_at=20.0, steps_done=2.0, now=20.0, live=live)
    assert steps.speed(2) == pytest.approx(0.5) and steps.assigned(2) == 2


def test_the_speed_is_smoothed_over_windows() -> None:
    steps = LocalSteps(_settings(window=4))
    live = _workers(1)
    steps.observe(1, 0.0, 4.0, 0.0, live)
    steps.observe(1, 4.0, 4.0, 4.0, live)  # 1 step/s
    steps.observe(1, 6.0, 4.0, 6.0, live)  # 2 steps/s
    assert steps.speed(1) == pytest.approx((1 - SPEED_SMOOTHING) * 1.0 + SPEED_SMOOTHING * 2.0)


def test_a_push_without_steps_done_counts_the_rules_window_and_bad_samples_are_skipped() -> None:
    steps = LocalSteps(_settings(window=6))
    live = _workers(1)
    steps.observe(1, 0.0, None, 0.0, live)
    steps.observe(1, 3.0, None, 3.0, live)  # a client that sends no steps_done took H = 6
    assert steps.speed(1) == pytest.approx(2.0)
    steps.observe(1, 3.0, 6.0, 3.0, live)  # no time passed: no sample
    steps.observe(1, 9.0, 0.0, 9.0, live)  # no steps: no sample
    assert steps.speed(1) == pytest.approx(2.0)


def test_workers_that_are_gone_no_longer_set_the_reference() -> None:
    steps = LocalSteps(_settings(window=8))
    both = _workers(1, 2)
    for worker_id, seconds_per_window in ((1, 1.0), (2, 4.0)):
        steps.observe(worker_id, 0.0, 8.0, 0.0, both)
        steps.observe(worker_id, seconds_per_window, 8.0, seconds_per_window, both)
    assert steps.assigned(2) == 2  # 2 steps/s against the fast worker's 8
    steps.observe(2, 8.0, 2.0, 8.0, _workers(2))  # the fast worker left
    assert steps.speed(1) is None and steps.assigned(2) == 8


def test_p90_reference_gives_the_fastest_more_than_the_window() -> None:
    steps = LocalSteps(_settings(window=10, reference="p90"))
    live = _workers(1, 2, 3, 4)
    for worker_id, slowdown in ((1, 1.0), (2, 1.0), (3, 2.0), (4, 4.0)):
        steps.observe(worker_id, 0.0, 10.0, 0.0, live)
        steps.observe(worker_id, 4.0 * slowdown, 10.0, 4.0 * slowdown, live)
    # Speeds 2.5, 2.5, 1.25, 0.625: p90 = 2.5 (the two fastest are level), v_ref below max only with spread.
    assert [steps.assigned(w) for w in (1, 2, 3, 4)] == [10, 10, 5, 2]
    steps.observe(2, 4.0, 10.0, 4.0, live)
    steps.observe(2, 5.0, 10.0, 5.0, live)  # worker 2 speeds up to 10 steps/s (EMA: 6.25)
    reference = reference_speed([2.5, 6.25, 1.25, 0.625], "p90")
    assert reference is not None and reference < 6.25
    assert steps.assigned(2) == int(6.25 / reference * 10) > 10


def test_settings_come_from_windowed_rules_with_dylu_on() -> None:
    on = RuleSpec.parse("diloco-dn", {"dylu": "true", "window": "12", "dylu_min": "3", "dylu_ref": "p90"})
    assert DyluSettings.of(on.options) == DyluSettings(12, 3, "p90")
    assert DyluSettings.of(RuleSpec.parse("diloco-dn", {}).options) is None
    assert DyluSettings.of(RuleSpec.parse("sa", {}).options) is None
    assert LocalSteps.of(ShardConfig(RuleSpec.parse("downpour", {}))).settings is None


def test_dylu_under_bsp_is_refused() -> None:
    spec = RuleSpec.parse("diloco", {"dylu": "true"})
    assert dylu_refusal(spec.options, ConsistencyModel.BSP) == DYLU_UNDER_BSP
    assert dylu_refusal(spec.options, ConsistencyModel.ASYNC) is None
    assert dylu_refusal(RuleSpec.parse("diloco", {}).options, ConsistencyModel.BSP) is None
    with pytest.raises(ValueError, match="DyLU"):
        Shard(ShardConfig(spec, consistency=Consistency(ConsistencyModel.BSP)))
