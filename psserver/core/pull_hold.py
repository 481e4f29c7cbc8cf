"""Holding the pulls of workers whose pushes land close together until all of those pushes are applied.

Delayed Nesterov (``diloco-dn``) takes its momentum step once every ``N`` pushes. A worker that
pulls right after its own push gets parameters without the pushes that land just after it and,
when those close the period, without the momentum step: with workers that finish together
(equal speeds, or DyLU's equalised windows) all but the last start every window about one outer
step stale. The scheduler of the paper's reference code (Liu, Douillard et al., 2024, the
asyncdiloco notebook's ``max_wait_time``) applies every push that lands within a grace period
of the first before any of their workers takes the server's parameters; workers that finish
together then start from the same parameters, as in synchronous DiLoCo.

Option ``pull_grace`` (seconds, 0 = off) is that grace period on the server. A push that finds
no batch open starts one that ends ``pull_grace`` seconds later; every push until then joins it,
and its worker's next pull waits until the batch ends or no other worker is due to join it: the
shard measures each worker's pace from its push timing (``local_steps``, as DyLU does) and waits
only for workers whose current window should end before the batch does. (The reference
scheduler knows every finishing time and ends its wait the same way.) A worker never waits
longer than the grace, so a slow or dead peer costs it at most that, and a worker of unknown
pace (its first two windows) is not waited for. Holds are not checkpointed (a restarted server
has none); observers never push, so they are never held. Asynchronous training only: under BSP
every pull already follows the round's one update.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from psserver.core.config import ShardConfig
from psserver.core.consistency import ConsistencyModel
from psserver.core.local_steps import LocalSteps, dylu_refusal
from psserver.core.observer import NullObserver, ShardObserver
from psserver.core.rules import RuleOptions, UpdateRule
from psserver.core.rules.diloco import pull_grace_of
from psserver.core.waiting import Abandoned, Waiting
from psserver.core.workers import WorkerRecord

PULL_GRACE_UNDER_BSP = (
    "pull_grace is for asynchronous training; under --consistency bsp every pull already follows the round's "
    "update: drop pull_grace or use async"
)


@dataclass(frozen=True)
class PullHold:
    """A worker's next pull waits, at the longest, until its batch ends at ``until_time``; ``released``
    once it pulled (kept until its next push: a worker released from a batch cannot join it again)."""

    until_time: float
    released: bool = False


class PullHolds:
    """The holds pushes put on their workers' next pulls, in batches of pushes that land close together.

    Used under the shard's lock."""

    def __init__(
        self,
        now: Callable[[], float],
        live: Callable[[], Iterable[WorkerRecord]],
        local_steps: LocalSteps,
        observer: ShardObserver | None = None,
    ) -> None:
        self._now = now
        self._live = live
        self._local_steps = local_steps
        self._observer = observer or NullObserver()
        self._batch_ends = -math.inf

    @classmethod
    def of(
        cls,
        config: ShardConfig,
        now: Callable[[], float],
        live: Callable[[], Iterable[WorkerRecord]],
        local_steps: LocalSteps,
        observer: ShardObserver,
    ) -> PullHolds:
        """The shard's. (The shard refuses a ``pull_grace`` under BSP before building it:
        :func:`consistency_refusal`.)"""
        return cls(now, live, local_steps, observer)

    def active(self, worker: WorkerRecord) -> PullHold | None:
        """``worker``'s hold while it still holds: it has not pulled, its batch has not ended, and another
        live worker is due to push before it ends (not held, not in this batch already, and its pace
        measured: a worker of unknown pace is not waited for)."""
        hold = worker.pull_hold
        if hold is None or hold.released or self._now() >= hold.until_time:
            return None
        for other in self._live():
            theirs = other.pull_hold
            if other is worker or (
                theirs is not None and (not theirs.released or theirs.until_time == hold.until_time)
            ):
                continue  # held, or already pushed in this batch
            due = self._local_steps.next_push_at(other.worker_id)
            if due is not None and due <= hold.until_time:
                return hold
        return None

    def wait(self, worker: WorkerRecord, waiting: Waiting, abandoned: Abandoned | None) -> None:
        """Wait (the shard's lock held) until ``worker``'s hold is over, then drop it."""
        hold = worker.pull_hold
        if hold is None or hold.released:
            return
        if self.active(worker) is not None:
            began = self._now()
            waiting.until(worker, lambda: self.active(worker) is None, abandoned, hold.until_time)
            self._observer.pull_held(worker, self._now() - began)
        # Its window starts now, not at its push: DyLU must not count the wait as slowness.
        self._local_steps.window_restarted(worker.worker_id, self._now())
        worker.pull_hold = PullHold(hold.until_time, released=True)

    def after_push(self, rule: UpdateRule[RuleOptions] | None) -> PullHold | None:
        """The hold on the next pull of a worker whose push was applied now."""
        grace = rule.pull_grace_seconds if rule is not None else 0.0
        if grace <= 0:
            return None
        now = self._now()
        if now > self._batch_ends:  # a push at the very end still joins: it is within the grace
            self._batch_ends = now + grace
        return PullHold(self._batch_ends)


def pull_grace_refusal(options: RuleOptions, consistency: ConsistencyModel) -> str | None:
    """Why these rule options cannot run under ``consistency``, or None."""
    if pull_grace_of(options) > 0 and consistency is ConsistencyModel.BSP:
        return PULL_GRACE_UNDER_BSP
    return None


def consistency_refusal(options: RuleOptions, consistency: ConsistencyModel) -> str | None:
    """Why these rule options' scheduling (DyLU, a pull grace) cannot run under ``consistency``, or None:
    the one check the serve CLI, the simulator and the shard itself make."""
    return dylu_refusal(options, consistency) or pull_grace_refusal(options, consistency)
