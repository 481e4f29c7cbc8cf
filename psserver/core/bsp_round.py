"""One bulk-synchronous round: the updates collected for the current clock, and who sent them.

The round decides what a push does to it (added, a retry of a contribution, refused); the
shard applies the round's mean with the rule once ``complete`` says every live worker pushed,
then starts the ``next`` round. Not thread-safe on its own: the shard calls it under its lock.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

import torch

from psserver.core.consistency import bsp_round_complete
from psserver.core.rules import PayloadKind
from psserver.core.workers import PushMemory, PushOutcome, WorkerRecord


@dataclass
class BspRound:
    total: torch.Tensor
    contributors: dict[int, int] = field(default_factory=dict)  # worker id -> push id
    # Whose push-id memory each contribution belongs to (a re-joined worker has a new id, same memory).
    owners: dict[int, PushMemory] = field(default_factory=dict)
    kind: PayloadKind = PayloadKind.GRADIENT  # set by the round's first push
    number: int = 0

    def contribution_of(self, push_id: int, memory: PushMemory) -> int | None:
        """The worker id under which this push (same push id, same name's memory) already contributed."""
        for worker_id, contributed in self.contributors.items():
            if contributed == push_id and self.owners.get(worker_id) is memory:
                return worker_id
        return None

    def hand_over(self, previous_id: int, worker_id: int) -> None:
        """A worker re-joined under a new id retried its contribution: it is now under the new id."""
        if previous_id != worker_id:
            self.contributors[worker_id] = self.contributors.pop(previous_id)
            self.owners[worker_id] = self.owners.pop(previous_id)

    def refusal(self, worker_id: int, kind: PayloadKind, clock: int) -> str | None:
        """Why this contribution may not be added, or None."""
        if worker_id in self.contributors:
            return f"worker {worker_id} already pushed for BSP clock {clock}; wait for the round to finish"
        if self.contributors and kind is not self.kind:
            return f"this BSP round collects {self.kind.name} pushes only"
        return None

    def add(self, worker_id: int, push_id: int, memory: PushMemory, update: torch.Tensor, kind: PayloadKind) -> None:
        if not self.contributors:
            self.kind = kind  # the first push of a round decides what it collects
        self.total.add_(update)
        self.contributors[worker_id] = push_id
        self.owners[worker_id] = memory

    def complete(self, live_workers: Collection[int]) -> bool:
        return bsp_round_complete(self.contributors, live_workers)

    def record(self, outcome: PushOutcome, joined: Mapping[int, WorkerRecord]) -> list[WorkerRecord]:
        """Record the applied round's outcome under every contribution's push id; the contributors
        still joined (their counters and SSP clocks advanced), for the shard to report."""
        still_joined = []
        for worker_id, push_id in self.contributors.items():
            contributor = joined.get(worker_id)
            if contributor is None:
                # Gone since (left, evicted, re-joined): its push id is still remembered as applied.
                owner = self.owners.get(worker_id)
                if owner is not None:
                    owner.record(push_id, outcome)
                continue
            contributor.record_push(push_id, outcome)
            contributor.ssp_clock += 1
            still_joined.append(contributor)
        return still_joined

    def mean(self) -> torch.Tensor:
        """The mean of the contributions, in place of their sum."""
        return self.total.div_(len(self.contributors))

    def next(self) -> BspRound:
        """The following round, reusing this one's buffer."""
        return BspRound(self.total.zero_(), number=self.number + 1)


@dataclass(frozen=True)
class Contribution:
    """Where a push went: the round it waits for, and whether it was a retry of one already in it."""

    round_number: int
    retried: bool


class BspBarrier:
    """The round collecting now, and what a push and a finished round do to it."""

    def __init__(self) -> None:
        self._round: BspRound | None = None

    def contribute(
        self, worker: WorkerRecord, push_id: int, kind: PayloadKind, update: torch.Tensor, clock: int
    ) -> Contribution | str:
        """Add ``update`` to the round (or recognise a retry of a contribution); why not, as a message."""
        if self._round is None:
            self._round = BspRound(torch.zeros(update.numel()), kind=kind)
        current = self._round
        retried_as = current.contribution_of(push_id, worker.memory)
        if retried_as is not None:
            # A retried push (perhaps from the same worker re-joined under a new id) already in
            # this round: it waits for the round instead of being added twice.
            current.hand_over(retried_as, worker.worker_id)
            return Contribution(current.number, retried=True)
        problem = current.refusal(worker.worker_id, kind, clock)
        if problem:
            return problem
        current.add(worker.worker_id, push_id, worker.memory, update, kind)
        return Contribution(current.number, retried=False)

    def finished(self, round_number: int) -> bool:
        return self._round is None or self._round.number != round_number

    def due(self, live_workers: Collection[int]) -> BspRound | None:
        """The round to apply now that every live worker contributed, else None."""
        return self._round if self._round is not None and self._round.complete(live_workers) else None

    def advance(self) -> None:
        """Start the next round (after the due one was applied, or found to have nobody left to answer)."""
        assert self._round is not None
        self._round = self._round.next()
