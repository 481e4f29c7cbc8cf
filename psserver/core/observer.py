"""What a shard reports as it works, for metrics, logs and checkpoints; the shard never knows who listens.

This is the shard's one hook mechanism: the observer given at construction and any added with
``Shard.subscribe`` hear every event, in that order (``Observers`` fans them out). Every method
is called with the shard lock held, so implementations must be quick and must not call back
into the shard (``update_committed`` hands over what a listener may need of the state).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from psserver.core.workers import PushOutcome, WorkerRecord


class ShardObserver(Protocol):
    def worker_joined(self, worker: WorkerRecord) -> None: ...

    def worker_left(self, worker: WorkerRecord, evicted: bool) -> None: ...

    def update_applied(self, apply_seconds: float, clock: int) -> None: ...

    # After an update and the push ids it answers are recorded. ``capture_state`` returns the
    # shard's ``state_dict`` of this moment (a checkpoint); call it during the callback only.
    def update_committed(self, clock: int, capture_state: Callable[[], dict[str, Any]]) -> None: ...

    def push_applied(self, worker: WorkerRecord, outcome: PushOutcome) -> None: ...

    def push_duplicate(self, worker: WorkerRecord) -> None: ...

    def bytes_received(self, worker: WorkerRecord, count: int) -> None: ...

    def pulled(self, worker: WorkerRecord, clock: int, bytes_sent: int) -> None: ...

    def rejected(self, reason: str, worker: WorkerRecord | None) -> None: ...

    def heartbeat(self, worker: WorkerRecord, stats: Mapping[str, float]) -> None: ...

    # The parameter version of ``clock`` was dropped to stay under the snapshot memory cap.
    def snapshot_dropped(self, clock: int) -> None: ...

    # A pull waited ``seconds`` on a hold its rule put on it (``rules.base.Wait.reported``).
    def pull_held(self, worker: WorkerRecord, seconds: float) -> None: ...


class NullObserver:
    """Listens to nothing."""

    def worker_joined(self, worker: WorkerRecord) -> None:
        pass

    def worker_left(self, worker: WorkerRecord, evicted: bool) -> None:
        pass

    def update_applied(self, apply_seconds: float, clock: int) -> None:
        pass

    def update_committed(self, clock: int, capture_state: Callable[[], dict[str, Any]]) -> None:
        pass

    def push_applied(self, worker: WorkerRecord, outcome: PushOutcome) -> None:
        pass

    def push_duplicate(self, worker: WorkerRecord) -> None:
        pass

    def bytes_received(self, worker: WorkerRecord, count: int) -> None:
        pass

    def pulled(self, worker: WorkerRecord, clock: int, bytes_sent: int) -> None:
        pass

    def rejected(self, reason: str, worker: WorkerRecord | None) -> None:
        pass

    def heartbeat(self, worker: WorkerRecord, stats: Mapping[str, float]) -> None:
        pass

    def snapshot_dropped(self, clock: int) -> None:
        pass

    def pull_held(self, worker: WorkerRecord, seconds: float) -> None:
        pass


class Observers:
    """Every event to each observer in turn; ``add`` returns the function that removes it again.

    Events read the tuple of observers once, so adding or removing one (under a small lock of
    its own, from any thread) never disturbs an event being delivered."""

    def __init__(self, first: ShardObserver) -> None:
        self._all: tuple[ShardObserver, ...] = (first,)
        self._changing = threading.Lock()

    def add(self, observer: ShardObserver) -> Callable[[], None]:
        with self._changing:
            self._all = (*self._all, observer)

        def remove() -> None:
            with self._changing:
                self._all = tuple(o for o in self._all if o is not observer)

        return remove

    def worker_joined(self, worker: WorkerRecord) -> None:
        for observer in self._all:
            observer.worker_joined(worker)

    def worker_left(self, worker: WorkerRecord, evicted: bool) -> None:
        for observer in self._all:
            observer.worker_left(worker, evicted)

    def update_applied(self, apply_seconds: float, clock: int) -> None:
        for observer in self._all:
            observer.update_applied(apply_seconds, clock)

    def update_committed(self, clock: int, capture_state: Callable[[], dict[str, Any]]) -> None:
        for observer in self._all:
            observer.update_committed(clock, capture_state)

    def push_applied(self, worker: WorkerRecord, outcome: PushOutcome) -> None:
        for observer in self._all:
            observer.push_applied(worker, outcome)

    def push_duplicate(self, worker: WorkerRecord) -> None:
        for observer in self._all:
            observer.push_duplicate(worker)

    def bytes_received(self, worker: WorkerRecord, count: int) -> None:
        for observer in self._all:
            observer.bytes_received(worker, count)

    def pulled(self, worker: WorkerRecord, clock: int, bytes_sent: int) -> None:
        for observer in self._all:
            observer.pulled(worker, clock, bytes_sent)

    def rejected(self, reason: str, worker: WorkerRecord | None) -> None:
        for observer in self._all:
            observer.rejected(reason, worker)

    def heartbeat(self, worker: WorkerRecord, stats: Mapping[str, float]) -> None:
        for observer in self._all:
            observer.heartbeat(worker, stats)

    def snapshot_dropped(self, clock: int) -> None:
        for observer in self._all:
            observer.snapshot_dropped(clock)

    def pull_held(self, worker: WorkerRecord, seconds: float) -> None:
        for observer in self._all:
            observer.pull_held(worker, seconds)
