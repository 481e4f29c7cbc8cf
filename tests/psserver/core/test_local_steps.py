"""Each worker's pace (psserver.core.local_steps): speeds from push timing, smoothed, and when it pushes next."""

from __future__ import annotations

import pytest

from psserver.core.local_steps import SPEED_SMOOTHING, WorkerPaces


def test_the_speed_is_smoothed_over_windows() -> None:
    paces = WorkerPaces()
    paces.observe(1, 0.0, 4.0, 0.0, [1], window=4)
    paces.observe(1, 4.0, 4.0, 4.0, [1], window=4)  # 1 step/s
    paces.observe(1, 6.0, 4.0, 6.0, [1], window=4)  # 2 steps/s
    assert paces.speed(1) == pytest.approx((1 - SPEED_SMOOTHING) * 1.0 + SPEED_SMOOTHING * 2.0)


def test_a_push_without_steps_done_counts_the_rules_window_and_bad_samples_are_skipped() -> None:
    paces = WorkerPaces()
    paces.observe(1, 0.0, None, 0.0, [1], window=6)
    paces.observe(1, 3.0, None, 3.0, [1], window=6)  # a client that sends no steps_done took the window, 6
    assert paces.speed(1) == pytest.approx(2.0)
    paces.observe(1, 3.0, 6.0, 3.0, [1], window=6)  # no time passed: no sample
    paces.observe(1, 9.0, 0.0, 9.0, [1], window=6)  # no steps: no sample
    assert paces.speed(1) == pytest.approx(2.0)


def test_workers_that_are_gone_are_forgotten() -> None:
    paces = WorkerPaces()
    for worker_id in (1, 2):
        paces.observe(worker_id, 0.0, 8.0, 0.0, [1, 2], window=8)
        paces.observe(worker_id, 4.0, 8.0, 4.0, [1, 2], window=8)
    assert sorted(paces.known_speeds()) == [2.0, 2.0]
    paces.observe(2, 8.0, 8.0, 8.0, [2], window=8)  # worker 1 left
    assert paces.speed(1) is None and paces.known_speeds() == [2.0]


def test_the_next_push_is_due_after_the_windows_steps_at_its_speed() -> None:
    paces = WorkerPaces()
    assert paces.next_push_at(1) is None
    paces.observe(1, 0.0, 10.0, 0.0, [1], window=10)
    assert paces.next_push_at(1) is None  # no speed yet
    paces.observe(1, 10.0, 10.0, 10.5, [1], window=10)  # 1 step/s; its next window began at 10.5
    assert paces.next_push_at(1) == 20.5  # as many steps as its last window
    assert paces.next_push_at(1, steps=4) == 14.5  # the steps its rule assigned
    paces.window_restarted(1, 12.0)  # its pull waited: the window begins later
    assert paces.next_push_at(1) == 22.0
