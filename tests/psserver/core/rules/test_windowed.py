"""What every windowed rule shares (psserver.core.rules._windowed): DyLU's options, Eq. 6 and its assignments."""

from __future__ import annotations

import pytest

from psserver.core.consistency import Consistency, ConsistencyModel
from psserver.core.local_steps import WorkerPaces
from psserver.core.rules import RULES, RuleOptionError, RuleSpec
from psserver.core.rules._windowed import (
    DYLU_OPTIONS,
    DYLU_UNDER_BSP,
    WindowedOptions,
    WindowedRule,
    assigned_steps,
    reference_speed,
)
from psserver.core.rules.base import LOCAL_STEPS_KEY, ShardView
from psserver.core.shard import Shard, ShardConfig

WINDOWED = ("agn", "diloco", "diloco-dn", "downpour", "dynsgd", "eamsgd", "easgd")


def test_every_windowed_rule_takes_dylu_off_by_default() -> None:
    windowed = sorted(name for name, rule in RULES.items() if issubclass(rule.options_type, WindowedOptions))
    assert tuple(windowed) == WINDOWED
    for name in WINDOWED:
        options = RuleSpec.parse(name, {}).options
        assert isinstance(options, WindowedOptions)
        assert (options.dylu, options.dylu_min, options.dylu_ref) == (False, 1, "max")
        on = RuleSpec.parse(name, {"dylu": "true", "dylu_min": "2", "dylu_ref": "p90"}).options
        assert isinstance(on, WindowedOptions) and (on.dylu, on.dylu_min, on.dylu_ref) == (True, 2, "p90")
        # The worker is told its steps in every push reply, not DyLU's options.
        sent = RuleSpec.parse(name, {"dylu": "true"}).build(6).procedure_options()
        assert "window" in sent and not DYLU_OPTIONS & set(sent)


@pytest.mark.parametrize("rule", sorted(set(RULES) - set(WINDOWED)))
def test_dylu_on_a_rule_without_local_steps_is_a_clear_error(rule: str) -> None:
    with pytest.raises(RuleOptionError, match=r"option dylu \(DyLU\) needs a windowed rule.*push every step"):
        RuleSpec.parse(rule, {"dylu": "true"})
    with pytest.raises(RuleOptionError, match=r"option dylu_min \(DyLU\) needs a windowed rule"):
        RuleSpec.parse(rule, {"dylu_min": "2"})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dylu_min": "0"}, r"option dylu_min=0 is out of range: value >= 1"),
        ({"dylu_min": "-3"}, r"option dylu_min=-3 is out of range"),
        ({"dylu_min": "9", "window": "8"}, r"dylu_min=9 is out of range: 1 <= dylu_min <= window = 8"),
        ({"dylu_ref": "p50"}, r"option dylu_ref='p50' must be one of max, p90"),
        ({"dylu": "maybe"}, r"option dylu='maybe' is not a valid bool"),
    ],
)
def test_bad_dylu_options_are_refused(options: dict[str, str], message: str) -> None:
    with pytest.raises(RuleOptionError, match=message):
        RuleSpec.parse("diloco-dn", options)


# -- DyLU: Eq. 6, the reference speed, and the window each push reply assigns --


def _rule(window: int = 8, minimum: int = 1, reference: str = "max") -> WindowedRule[WindowedOptions]:
    options = {"dylu": "true", "window": str(window), "dylu_min": str(minimum), "dylu_ref": reference}
    rule = RuleSpec.parse("downpour", options).build(4)
    assert isinstance(rule, WindowedRule)
    return rule


class _Paced:
    """A DyLU rule over the shard's own pace measurement, as the shard runs it."""

    def __init__(self, rule: WindowedRule[WindowedOptions]) -> None:
        self.rule = rule
        self.paces = WorkerPaces()
        self.live: list[int] = []
        self.view = ShardView(lambda: 0.0, lambda: self.live, self.paces)

    def observe(self, worker_id: int, header_at: float, steps_done: float | None, now: float, live: list[int]) -> None:
        self.live = live
        assert self.rule.paced_window is not None
        self.paces.observe(worker_id, header_at, steps_done, now, live, self.rule.paced_window)

    def speed(self, worker_id: int) -> float | None:
        return self.paces.speed(worker_id)

    def assigned(self, worker_id: int) -> int:
        decision = self.rule.after_push(worker_id, self.view)
        return int(decision.telemetry[LOCAL_STEPS_KEY])


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
    steps = _Paced(_rule(window=8))
    live = [1, 2]
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


def test_workers_that_are_gone_no_longer_set_the_reference() -> None:
    steps = _Paced(_rule(window=8))
    for worker_id, seconds_per_window in ((1, 1.0), (2, 4.0)):
        steps.observe(worker_id, 0.0, 8.0, 0.0, [1, 2])
        steps.observe(worker_id, seconds_per_window, 8.0, seconds_per_window, [1, 2])
    assert steps.assigned(2) == 2  # 2 steps/s against the fast worker's 8
    steps.observe(2, 8.0, 2.0, 8.0, [2])  # the fast worker left
    assert steps.speed(1) is None and steps.assigned(2) == 8


def test_p90_reference_gives_the_fastest_more_than_the_window() -> None:
    steps = _Paced(_rule(window=10, reference="p90"))
    live = [1, 2, 3, 4]
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


def test_only_windowed_rules_with_dylu_on_measure_paces_and_assign_windows() -> None:
    view = ShardView(lambda: 0.0, list, WorkerPaces())
    on = RuleSpec.parse("diloco-dn", {"dylu": "true", "window": "12"}).build(4)
    assert on.paced_window == 12 and on.after_push(1, view).telemetry == {LOCAL_STEPS_KEY: 12.0}
    for name, options in (("diloco-dn", {}), ("downpour", {}), ("sa", {})):
        rule = RuleSpec.parse(name, options).build(4)
        assert rule.paced_window is None and not rule.after_push(1, view).telemetry


def test_dylu_under_bsp_is_refused() -> None:
    spec = RuleSpec.parse("diloco", {"dylu": "true"})
    assert spec.options.consistency_refusal(ConsistencyModel.BSP) == DYLU_UNDER_BSP
    assert spec.options.consistency_refusal(ConsistencyModel.ASYNC) is None
    assert RuleSpec.parse("diloco", {}).options.consistency_refusal(ConsistencyModel.BSP) is None
    with pytest.raises(ValueError, match="DyLU"):
        Shard(ShardConfig(spec, consistency=Consistency(ConsistencyModel.BSP)))
