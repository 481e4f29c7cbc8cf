"""Scoring a race's snapshots in a separate process at the lowest CPU priority, beside the next race.

Scoring a 60-second Fashion-MNIST run costs 35-110 s of CPU (whole-test-set evaluations near the
target), more than the race itself. :class:`BackgroundScorer` hands each run's snapshots to one
process running at ``nice 19`` with one thread, so it only takes CPU that the race's processes
leave idle: the kernel gives a nice-19 process about 1.5 % of a core against a runnable nice-0
one. The race's own record of how often a step took longer than its pace (*overruns*) shows what
it still costs; ``benchmarks.time_to_accuracy --score-between-races`` scores each run before the
next race starts instead. Snapshots travel through a file (a run's ~30 parameter copies), not a
pipe, so nothing large is pickled.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import torch

from benchmarks.harness.race import process_context
from benchmarks.harness.snapshots import Score, Snapshot, score
from psworker.tasks import Task, load_task

NICENESS = 19

# The scoring process's task, loaded once by its initializer.
_LOADED: dict[str, Task] = {}


def _priority() -> int:
    return os.getpriority(os.PRIO_PROCESS, 0)


def _start(task: str, data_dir: Path | None) -> None:
    os.nice(max(0, NICENESS - _priority()))
    torch.set_num_threads(1)
    _LOADED["task"] = load_task(task, data_dir)


def _score_file(path: Path, target: float) -> tuple[Score, float]:
    snapshots: list[Snapshot] = torch.load(path)
    path.unlink()
    began = time.monotonic()
    return score(_LOADED["task"], snapshots, target), time.monotonic() - began


class BackgroundScorer:
    """One low-priority process that scores runs in the order they are given."""

    def __init__(self, task: str, data_dir: Path | None) -> None:
        self._pool = ProcessPoolExecutor(1, mp_context=process_context(), initializer=_start, initargs=(task, data_dir))

    def submit(self, snapshots: list[Snapshot], target: float, spool: Path) -> Future[tuple[Score, float]]:
        """Score ``snapshots`` against ``target``; the future gives the score and the seconds it took."""
        spool.parent.mkdir(parents=True, exist_ok=True)
        torch.save(snapshots, spool)
        return self._pool.submit(_score_file, spool, target)

    def niceness(self) -> int:
        """The scoring process's niceness (its CPU priority: 19 is the lowest)."""
        return self._pool.submit(_priority).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> BackgroundScorer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
