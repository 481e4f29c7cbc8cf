"""Scoring a race's snapshots in separate processes at the lowest CPU priority, beside the next race.

Scoring a 60-second Fashion-MNIST run costs 35-110 s of CPU (whole-test-set evaluations near the
target), more than the race itself. :class:`BackgroundScorer` hands each run's snapshots to
processes running at ``nice 19`` with one thread each, so they only take CPU that the race's
processes leave idle: the kernel gives a nice-19 process about 1.5 % of a core against a runnable
nice-0 one. There is one process per core: beside a race they share the idle time, and the runs
still waiting when the last race ends are scored on every core instead of one. The race's own
record of how often a step took longer than its pace (*overruns*) shows what scoring still costs;
``experiments.time_to_accuracy --score-between-races`` scores each run before the next race starts
instead. Snapshots travel through a file (a run's ~30 parameter copies), not a
pipe, so nothing large is pickled.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import NamedTuple

import torch

from experiments.harness.race import process_context
from experiments.harness.snapshots import Score, Snapshot, score
from pstasks.tasks import load_task
from psworker.task import Task

NICENESS = 19

# The scoring process's task, loaded once by its initializer.
_LOADED: dict[str, Task] = {}


def _priority() -> int:
    return os.getpriority(os.PRIO_PROCESS, 0)


def _start(task: str, data_dir: Path | None) -> None:
    os.nice(max(0, NICENESS - _priority()))
    torch.set_num_threads(1)
    _LOADED["task"] = load_task(task, data_dir)


class Scored(NamedTuple):
    """A run's score, the seconds it took and the scoring process's id."""

    score: Score
    seconds: float
    pid: int


def _score_file(path: Path, target: float) -> Scored:
    snapshots: list[Snapshot] = torch.load(path)
    path.unlink()
    began = time.monotonic()
    scored = score(_LOADED["task"], snapshots, target)
    return Scored(scored, time.monotonic() - began, os.getpid())


class BackgroundScorer:
    """Low-priority processes (one per core unless ``processes`` is given) that score runs,
    taking them in the order they are given."""

    def __init__(self, task: str, data_dir: Path | None, processes: int | None = None) -> None:
        count = processes or len(os.sched_getaffinity(0))
        self._pool = ProcessPoolExecutor(
            count, mp_context=process_context(), initializer=_start, initargs=(task, data_dir)
        )

    def submit(self, snapshots: list[Snapshot], target: float, spool: Path) -> Future[Scored]:
        """Score ``snapshots`` against ``target``."""
        spool.parent.mkdir(parents=True, exist_ok=True)
        torch.save(snapshots, spool)
        return self._pool.submit(_score_file, spool, target)

    def niceness(self) -> int:
        """A scoring process's niceness (its CPU priority: 19 is the lowest)."""
        return self._pool.submit(_priority).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> BackgroundScorer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
