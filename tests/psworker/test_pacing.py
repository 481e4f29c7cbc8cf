"""Emulated device speed: a step lasts slowdown × step time, or slowdown × its compute time."""

from __future__ import annotations

import time

import pytest

from psworker.pacing import Pace


def test_a_fixed_step_time_sets_the_step_length_whatever_the_compute_took() -> None:
    pace = Pace(slowdown=3.0, step_seconds=0.01)
    started = time.perf_counter()
    assert pace.finish_step(0.005) == pytest.approx(0.03)
    assert time.perf_counter() - started >= 0.025
    assert pace.overruns == 0


def test_compute_longer_than_the_emulated_step_is_an_overrun_and_no_idle() -> None:
    pace = Pace(slowdown=1.0, step_seconds=0.001)
    started = time.perf_counter()
    assert pace.finish_step(0.05) == 0.05
    assert time.perf_counter() - started < 0.02
    assert (pace.overruns, pace.overrun_fraction) == (1, 1.0)


def test_without_a_step_time_the_slowdown_scales_the_compute_time() -> None:
    pace = Pace(slowdown=2.0)
    started = time.perf_counter()
    assert pace.finish_step(0.01) == pytest.approx(0.02)
    assert time.perf_counter() - started >= 0.009
    assert pace.emulated_seconds == pytest.approx(0.02)


@pytest.mark.parametrize(("slowdown", "step"), [(0.5, None), (1.0, 0.0), (1.0, -1.0)])
def test_impossible_speeds_are_refused(slowdown: float, step: float | None) -> None:
    with pytest.raises(ValueError):
        Pace(slowdown, step)


@pytest.mark.parametrize(("flag", "value"), [("--step-time", "0"), ("--step-time", "-1"), ("--max-seconds", "0")])
def test_the_train_command_refuses_a_step_time_or_time_limit_that_is_not_positive(flag: str, value: str) -> None:
    from click.testing import CliRunner

    from pstasks.cli import main

    result = CliRunner().invoke(main, ["train", "--server", "127.0.0.1:9", flag, value])
    assert result.exit_code == 2
    assert flag in result.output
