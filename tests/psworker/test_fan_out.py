"""fan_out: one call per shard at once, the last on the calling thread, results and errors in order."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import pytest

from psworker.fan_out import fan_out


def _thread_name() -> str:
    return threading.current_thread().name


def test_results_come_in_order_and_the_last_call_runs_on_the_calling_thread() -> None:
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="pool") as pool:
        names = fan_out(pool, [_thread_name, _thread_name, _thread_name])
        assert names[-1] == threading.current_thread().name
        assert all(name.startswith("pool") for name in names[:-1])
        assert fan_out(pool, [lambda: 1, lambda: 2, lambda: 3]) == [1, 2, 3]
        assert fan_out(pool, [_thread_name]) == [threading.current_thread().name]
        assert fan_out(pool, []) == []


def _fails(message: str) -> Callable[[], int]:
    def call() -> int:
        raise ValueError(message)

    return call


def test_the_first_failing_call_in_order_is_the_error_raised() -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        with pytest.raises(ValueError, match="first"):
            fan_out(pool, [lambda: 0, _fails("first"), _fails("last")])
        with pytest.raises(ValueError, match="last"):
            fan_out(pool, [lambda: 0, _fails("last")])
        with pytest.raises(ValueError, match="first"):
            fan_out(pool, [_fails("first"), lambda: 1])
