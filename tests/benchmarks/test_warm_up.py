"""``steps.warm_up``: every system warms by the same rule, until its processes' memory holds still."""

from __future__ import annotations

from collections.abc import Callable

import torch

from benchmarks.harness.steps import STABLE_STEPS, WARMUP_CAP, warm_up


class _Counting:
    client_pids: tuple[int, ...] = ()

    def __init__(self) -> None:
        self.steps = 0

    def step(self, update: torch.Tensor, out: torch.Tensor) -> None:
        self.steps += 1

    def close(self) -> None:
        pass


def _memory(growth: list[float]) -> tuple[_Counting, Callable[[], float]]:
    """A system whose processes grow by ``growth[i]`` MB on step ``i`` (nothing after the list)."""
    system = _Counting()

    def rss_mb() -> float:
        return 100.0 + sum(growth[: system.steps])

    return system, rss_mb


def test_a_system_that_reuses_its_buffers_warms_in_the_minimum_and_the_stable_steps() -> None:
    system, rss = _memory([])
    taken = warm_up(system, torch.zeros(1), torch.zeros(1), 3, rss)
    assert taken == system.steps == max(3, STABLE_STEPS)


def test_a_system_still_growing_warms_until_it_stops() -> None:
    # The TensorPipe peer: 47 MB a step for 25 steps, with pauses of up to 3 steps in between.
    growth = [47.0] * 7 + [0.0, 0.0, 0.0] + [47.0] * 18
    system, rss = _memory(growth)
    taken = warm_up(system, torch.zeros(1), torch.zeros(1), 3, rss)
    assert taken == len(growth) + STABLE_STEPS


def test_warm_up_stops_at_the_cap() -> None:
    system, rss = _memory([10.0] * (WARMUP_CAP * 2))
    assert warm_up(system, torch.zeros(1), torch.zeros(1), 3, rss) == WARMUP_CAP
