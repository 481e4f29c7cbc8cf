"""Waiting inside the shard: a request held until its condition holds, its worker evicted, or its
client gone.

A pull waits while SSP holds it back or for what its rule asks (another worker's exclusive pull,
a hold until pushes landing with its own are applied); a push waits for what its rule asks or for
its BSP round. ``Waiting.until`` does every such wait on the shard's one condition (the
caller holds its lock), waking each ``WAIT_SLICE_S`` to evict workers whose lease ran out (a dead
worker must never stall the others) and to ask the transport whether the call's client is still
there (``abandoned``: for gRPC, ``not context.is_active()``; a client that cancelled or whose
deadline passed).

A wait is a pause in the shard's steps, not a blocked thread: the operations that may wait are
generators (``Steps``) that yield a ``Pause`` with the lock held, and their driver decides how
to wait. ``run_blocking`` waits on the pause's condition on the calling thread (the in-process
service, tests); the gRPC transport's driver (``psserver.rpc.awaiting``) releases the lock and
awaits the next change on its event loop, so a waiting call holds no thread. What wakes both is
``Signal.notify_all``: the condition's threads and every listener.

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
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from psserver.core.errors import ErrorKind
from psserver.core.membership import Membership
from psserver.core.refusals import Refusals
from psserver.core.workers import WorkerRecord

# How often a waiting request wakes to re-check leases and whether its client is still there.
WAIT_SLICE_S = 0.2

# The transport's answer to "did this call's client give up?" (None: the call cannot be abandoned).
Abandoned = Callable[[], bool]

T = TypeVar("T")


class Signal:
    """A lock, the condition threads wait on under it, and listeners: what ``notify_all`` wakes.

    ``changes`` counts the notifications, so a driver that let go of the lock can tell whether
    anything changed since (a listener may run before the driver waits)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.condition = threading.Condition(self.lock)
        self.changes = 0
        self._listeners: tuple[Callable[[], object], ...] = ()

    def notify_all(self) -> None:
        """Wake every waiter (the caller holds ``lock``); listeners must only schedule work, not do it."""
        self.changes += 1
        self.condition.notify_all()
        for listener in self._listeners:
            listener()

    def listen(self, listener: Callable[[], object]) -> Callable[[], None]:
        """Call ``listener`` at every notification (under ``lock``); returns the function that stops it."""
        with self.lock:
            self._listeners = (*self._listeners, listener)

        def stop() -> None:
            with self.lock:
                self._listeners = tuple(kept for kept in self._listeners if kept is not listener)

        return stop


@dataclass(frozen=True, eq=False)
class Pause:
    """Paused steps, holding ``signal.lock``: their driver waits at most ``seconds`` (None: no limit) for ``signal``
    (``ready``, a pure check under the lock, says whether resuming would go on), then resumes them
    with the lock held again."""

    signal: Signal
    seconds: float | None
    ready: Callable[[], bool]


# An operation that may wait: it yields a ``Pause`` for each wait and returns its result.
Steps = Generator[Pause, None, T]


def run_blocking(steps: Steps[T]) -> T:
    """Run ``steps`` on this thread, waiting on each pause's condition (which lets go of its lock meanwhile)."""
    try:
        pause = next(steps)
        while True:
            pause.signal.condition.wait(pause.seconds)
            pause = steps.send(None)
    except StopIteration as done:
        result: Any = done.value
        return result  # type: ignore[no-any-return]


class Waiting:
    """The shard's wait loop, given its condition, its clock, who is joined and how to evict."""

    def __init__(
        self,
        changed: Signal,
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
    ) -> Steps[None]:
        """Wait (the signal's lock held) until ``ready``; ``deadline`` (on the shard's clock), when
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
                yield Pause(self._changed, wait, ready)
                if abandoned is None or not abandoned():
                    worker.last_seen = self._now()
                self._evict_expired()
        finally:
            worker.waiting = False
