"""Waiting inside the shard: a request held until its condition holds, its worker evicted, or its
client gone.

A pull waits while SSP holds it back or for what its rule asks (another worker's exclusive pull,
a hold until pushes landing with its own are applied); a push waits for what its rule asks or for
its BSP round. ``Waiting.until`` does every such wait on the shard's one condition (the
caller holds its lock), waking each ``WAIT_SLICE_S`` to evict workers whose lease ran out (a dead
worker must never stall the others) and to ask the transport whether the call's client is still
there (``abandoned``: for gRPC, ``not context.is_active()``; a client that cancelled or whose
deadline passed).

A waiter keeps its worker alive while its client is there: the wait is the server's, not the
worker's silence. An abandoned wait ends at once (ABANDONED, counted in the rejections; nobody
receives the status) and gives its server thread back; from then on its worker is alive only
if it calls again, so a worker that never comes back is evicted when its lease runs out.

Pushes stay exactly once when their client gives up while they wait (``PendingPush.abandoned``):

- a push waiting for its rule (another worker's exclusive pull) is not applied; the client's retry
  (same push id) is;
- a BSP push waiting for its round was already added to the round: when the round completes it
  is recorded as applied under the worker's push-id memory (``BspRound.record``, also for a
  worker evicted meanwhile), so the retry is answered as a duplicate; a retry before the round
  completes is recognised as the same contribution and waits for the round again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from psserver.core.errors import ErrorKind
from psserver.core.membership import Membership
from psserver.core.refusals import Refusals
from psserver.core.workers import WorkerRecord

# How often a waiting request wakes to re-check leases and whether its client is still there.
WAIT_SLICE_S = 0.2

# The transport's answer to "did this call's client give up?" (None: the call cannot be abandoned).
Abandoned = Callable[[], bool]


class Waiting:
    """The shard's wait loop, given its condition, its clock, who is joined and how to evict."""

    def __init__(
        self,
        changed: threading.Condition,
        now: Callable[[], float],
        joined: Membership,
        evict_expired: Callable[[], object],
        refusals: Refusals,
        slice_seconds: float = WAIT_SLICE_S,
    ) -> None:
        self._changed = changed
        self._now = now
        self._joined = joined
        self._evict_expired = evict_expired
        self._refusals = refusals
        self._slice = slice_seconds

    def until(
        self,
        worker: WorkerRecord,
        ready: Callable[[], bool],
        abandoned: Abandoned | None = None,
        deadline: float | None = None,
    ) -> None:
        """Wait (the condition's lock held) until ``ready``; ``deadline`` (on the shard's clock), when
        ``ready`` turns true by then at the latest, shortens the last slice to it.

        Refused with UNKNOWN_WORKER when the worker is evicted meanwhile, and with ABANDONED
        within a slice of its client giving up (then the worker is no longer kept alive)."""
        worker.waiting = True
        try:
            while not ready():
                if worker.worker_id not in self._joined:
                    self._refusals.refuse(
                        ErrorKind.UNKNOWN_WORKER, f"worker {worker.worker_id} was evicted while waiting"
                    )
                if abandoned is not None and abandoned():
                    self._refusals.refuse(
                        ErrorKind.ABANDONED,
                        f"worker {worker.name} ({worker.worker_id}) gave up on its call (cancelled, or its deadline "
                        "passed) while it waited in the shard; the wait ended",
                        worker,
                    )
                wait = self._slice if deadline is None else min(self._slice, max(0.0, deadline - self._now()))
                self._changed.wait(wait)
                if abandoned is None or not abandoned():
                    worker.last_seen = self._now()
                self._evict_expired()
        finally:
            worker.waiting = False
