"""``benchmarks.replication``'s arithmetic, without processes (its runs: ``benchmarks.replication --smoke``)."""

from __future__ import annotations

import random

import pytest

from benchmarks.replication import _quarter_rates


def test_a_steady_rate_reads_the_same_in_every_quarter_whatever_order_the_steps_finished_in() -> None:
    finished = [index / 100 for index in range(401)]  # 100 updates a second throughout
    random.Random(1).shuffle(finished)
    assert _quarter_rates(finished) == pytest.approx([100.0] * 4)


def test_a_rate_that_falls_as_the_run_goes_on_reads_lower_in_the_last_quarter() -> None:
    finished, now = [], 0.0
    for index in range(400):
        now += 0.01 * (1 + index / 100)  # each update costs more than the one before
        finished.append(now)
    rates = _quarter_rates(finished)
    assert rates == sorted(rates, reverse=True)
    assert rates[3] / rates[0] < 0.5
