"""Carrying out a rule's scheduling decisions: the waits its hooks ask for, and the paces they read.

The rule decides (``rules.base``: ``pull_wait``, ``pull_taken``, ``push_wait``, ``after_push``,
...); this component, used by the shard under its lock, does what the decisions say: waits on
the shard's condition, restarts a worker's window, measures each worker's pace from its push
timing when the rule reads paces (``paced_window``), and adds what follows a push to its
outcome. It names no rule.
"""

from __future__ import annotations

from collections.abc import Callable

from psserver.core.local_steps import WorkerPaces
from psserver.core.membership import Membership
from psserver.core.observer import ShardObserver
from psserver.core.receiving import PendingPush
from psserver.core.rules import UpdateRule
from psserver.core.rules.base import PullHold, ShardView, Wait
from psserver.core.rules.options import RuleOptions
from psserver.core.waiting import Abandoned, Steps, Waiting
from psserver.core.workers import PushOutcome, WorkerRecord

Rule = UpdateRule[RuleOptions]


class Scheduling:
    """The shard's executor of its rule's scheduling hooks."""

    def __init__(
        self,
        now: Callable[[], float],
        membership: Membership,
        waiting: Waiting,
        observer: ShardObserver,
        exclusive_pull_seconds: float,
    ) -> None:
        self._now = now
        self._membership = membership
        self._waiting = waiting
        self._observer = observer
        self.paces = WorkerPaces()
        self.view = ShardView(now, self._live_ids, self.paces, exclusive_pull_seconds)

    def _live_ids(self) -> list[int]:
        return [w.worker_id for w in self._membership.live()]

    def wait(self, worker: WorkerRecord, wait: Wait | None, abandoned: Abandoned | None) -> Steps[None]:
        """Wait as a rule's hook decided; a reported wait is observed as a pull hold (``pull_held``)."""
        if wait is None:
            return
        began = self._now()
        yield from self._waiting.until(worker, wait.ready, abandoned, wait.deadline)
        if wait.reported:
            self._observer.pull_held(worker, self._now() - began)

    def admit_pull(self, worker: WorkerRecord, rule: Rule, exclusive: bool, abandoned: Abandoned | None) -> Steps[None]:
        """Wait for what the rule asks of this pull, then let it take the pull (its window may restart)."""
        yield from self.wait(worker, rule.pull_wait(worker.worker_id, exclusive, self.view), abandoned)
        if rule.pull_taken(worker.worker_id, exclusive, self.view).restart_window:
            self.paces.window_restarted(worker.worker_id, self._now())

    def admit_push(self, worker: WorkerRecord, rule: Rule, abandoned: Abandoned | None) -> Steps[None]:
        """Wait for what the rule asks of this push before it is applied; then it is taken."""
        yield from self.wait(worker, rule.push_wait(worker.worker_id, self.view), abandoned)
        rule.push_taken(worker.worker_id)

    def after_push(self, worker: WorkerRecord, rule: Rule, pushed: PendingPush, outcome: PushOutcome) -> None:
        """``pushed`` was applied now: take the window it ended (its header's arrival) as a pace sample when
        the rule reads paces, and add what the rule decides follows to ``outcome``."""
        window = rule.paced_window
        if window is not None:
            steps_done = pushed.metadata.get("steps_done")
            self.paces.observe(worker.worker_id, pushed.opened_at, steps_done, self._now(), self._live_ids(), window)
        outcome.telemetry.update(rule.after_push(worker.worker_id, self.view).telemetry)

    def pull_hold(self, rule: Rule | None, worker_id: int) -> PullHold | None:
        return None if rule is None else rule.pull_hold(worker_id, self.view)
