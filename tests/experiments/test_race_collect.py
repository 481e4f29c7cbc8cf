"""The race's wait for its workers' messages: an early, clean end is fine; a death is not."""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

import pytest

from experiments.harness.race import _collect


@dataclass
class _Ended:
    exitcode: int | None


def _messages(*items: tuple[str, object]) -> queue.Queue[tuple[str, object]]:
    messages: queue.Queue[tuple[str, object]] = queue.Queue()
    for item in items:
        messages.put(item)
    return messages


def test_a_worker_that_reported_and_ended_does_not_stop_the_wait() -> None:
    # Rank 1 reported and ended (a diverged run stops early); rank 0's result comes after a quiet second.
    messages = _messages(("result", {"rank": 1}))
    processes = [_Ended(None), _Ended(0)]

    def late_result() -> None:
        messages.put(("result", {"rank": 0}))

    timer = threading.Timer(1.5, late_result)
    timer.start()
    try:
        received = _collect(messages, "result", 2, processes, timeout=10.0)
    finally:
        timer.cancel()
    assert sorted(body["rank"] for body in received) == [0, 1]


def test_a_worker_that_ended_without_its_message_fails_the_run() -> None:
    messages = _messages(("ready", 1))
    with pytest.raises(RuntimeError, match=r"did not report ready \(exit codes \[0, None\]\)"):
        _collect(messages, "ready", 2, [_Ended(0), _Ended(None)], timeout=10.0)


def test_a_worker_that_died_fails_the_run_even_after_reporting() -> None:
    messages = _messages(("result", {"rank": 0}))
    with pytest.raises(RuntimeError, match="exit codes"):
        _collect(messages, "result", 2, [_Ended(-9), _Ended(None)], timeout=10.0)
