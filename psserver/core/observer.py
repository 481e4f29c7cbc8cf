"""What a shard reports as it works, for metrics and logs; the shard never knows who listens.

Every method is called with the shard lock held, so implementations must be quick and must
not call back into the shard.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from psserver.core.workers import PushOutcome, WorkerRecord


class ShardObserver(Protocol):
    def worker_joined(self, worker: WorkerRecord) -> None: ...

    def worker_left(self, worker: WorkerRecord, evicted: bool) -> None: ...

    def update_applied(self, apply_seconds: float, clock: int) -> None: ...

    def push_applied(self, worker: WorkerRecord, outcome: PushOutcome) -> None: ...

    def push_duplicate(self, worker: WorkerRecord) -> None: ...

    def bytes_received(self, worker: WorkerRecord, count: int) -> None: ...

    def pulled(self, worker: WorkerRecord, clock: int, bytes_sent: int) -> None: ...

    def rejected(self, reason: str, worker: WorkerRecord | None) -> None: ...

    def heartbeat(self, worker: WorkerRecord, stats: Mapping[str, float]) -> None: ...

    # The parameter version of ``clock`` was dropped to stay under the snapshot memory cap.
    def snapshot_dropped(self, clock: int) -> None: ...


class NullObserver:
    """Listens to nothing."""

    def worker_joined(self, worker: WorkerRecord) -> None:
        pass

    def worker_left(self, worker: WorkerRecord, evicted: bool) -> None:
        pass

    def update_applied(self, apply_seconds: float, clock: int) -> None:
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
