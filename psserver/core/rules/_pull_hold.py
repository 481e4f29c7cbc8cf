"""Delayed Nesterov's ``pull_grace``: holding the pulls of workers whose pushes land close together
until all of those pushes are applied.

Delayed Nesterov (``diloco-dn``) takes its momentum step once every ``N`` pushes. A worker that
pulls right after its own push gets parameters without the pushes that land just after it and,
when those close the period, without the momentum step: with workers that finish together
(equal speeds, or windows sized to their speeds) all but the last start every window about one outer
step stale. The scheduler of the paper's reference code (Liu, Douillard et al., 2024, the
asyncdiloco notebook's ``max_wait_time``) applies every push that lands within a grace period
of the first before any of their workers takes the server's parameters; workers that finish
together then start from the same parameters, as in synchronous DiLoCo.

Option ``pull_grace`` (seconds, 0 = off) is that grace period on the server. A push that finds
no batch open starts one that ends ``pull_grace`` seconds later; every push until then joins it,
and its worker's next pull waits until the batch ends or no other worker is due to join it: the
shard measures each worker's pace from its push timing (``psserver.core.local_steps``) and the
hold waits only for workers whose current window should end before the batch does. (The
reference scheduler knows every finishing time and ends its wait the same way.) A worker never
waits longer than the grace, so a slow or dead peer costs it at most that, and a worker of
unknown pace (its first two windows) is not waited for. Holds are not checkpointed (a restarted
server has none); observers never push, so they are never held. Asynchronous training only:
under BSP every pull already follows the round's one update.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from psserver.core.rules.base import PullHold, ShardView, Wait

PULL_GRACE_UNDER_BSP = (
    "pull_grace is for asynchronous training; under --consistency bsp every pull already follows the round's "
    "update: drop pull_grace or use async"
)


class PullHolds:
    """The holds pushes put on their workers' next pulls, in batches of pushes that land close together.

    ``window_of``: the steps of a worker's current window when its rule assigns them, else None
    (as many as its last). Used under the shard's lock."""

    def __init__(self, grace: float, window_of: Callable[[int, ShardView], int | None]) -> None:
        self.grace = grace
        self._window_of = window_of
        self._holds: dict[int, PullHold] = {}
        self._batch_ends = -math.inf

    def of(self, worker_id: int) -> PullHold | None:
        """The hold ``worker_id``'s last push set, released or not."""
        return self._holds.get(worker_id)

    def active(self, worker_id: int, view: ShardView) -> PullHold | None:
        """``worker_id``'s hold while it still holds: it has not pulled, its batch has not ended, and another
        live worker is due to push before it ends (not held, not in this batch already, and its pace
        measured: a worker of unknown pace is not waited for)."""
        hold = self._holds.get(worker_id)
        if hold is None or hold.released or view.now() >= hold.until_time:
            return None
        for other in view.live():
            theirs = self._holds.get(other)
            if other == worker_id or (
                theirs is not None and (not theirs.released or theirs.until_time == hold.until_time)
            ):
                continue  # held, or already pushed in this batch
            due = view.paces.next_push_at(other, self._window_of(other, view))
            if due is not None and due <= hold.until_time:
                return hold
        return None

    def wait(self, worker_id: int, view: ShardView) -> Wait | None:
        """What ``worker_id``'s pull waits for: the end of its hold, reported as a pull hold."""
        hold = self.active(worker_id, view)
        if hold is None:
            return None
        return Wait(lambda: self.active(worker_id, view) is None, hold.until_time, reported=True)

    def release(self, worker_id: int) -> bool:
        """``worker_id`` pulls: its hold is over (kept until its next push: a worker released from a batch
        cannot join it again). True when it had one: its window starts now, not at its push."""
        hold = self._holds.get(worker_id)
        if hold is None or hold.released:
            return False
        self._holds[worker_id] = PullHold(hold.until_time, released=True)
        return True

    def after_push(self, worker_id: int, now: float) -> None:
        """Hold the next pull of ``worker_id``, whose push was applied at ``now``."""
        if self.grace <= 0:
            return
        if now > self._batch_ends:  # a push at the very end still joins: it is within the grace
            self._batch_ends = now + self.grace
        self._holds[worker_id] = PullHold(self._batch_ends)

    def forget(self, worker_id: int) -> None:
        self._holds.pop(worker_id, None)
