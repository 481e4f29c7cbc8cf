"""The shard's count of refused requests, by reason, and the one way a component refuses.

Every component refuses through ``Refusals.refuse``: the refusal is counted (Status
``rejected`` and the metrics) and raised as a ``ShardError`` marked counted, so the transport
does not count it again. The counts have their own lock: refusals are counted outside the
shard lock too (authentication, stalled pushes).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import NoReturn

from psserver.core.errors import ErrorKind, ShardError
from psserver.core.observer import ShardObserver
from psserver.core.workers import WorkerRecord


class Refusals:
    def __init__(self, observer: ShardObserver) -> None:
        self._observer = observer
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def refuse(
        self,
        kind: ErrorKind,
        message: str,
        worker: WorkerRecord | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> NoReturn:
        """Count the refusal and raise it (``metadata``: the ErrorInfo's facts for the client)."""
        self.count(kind.reason, worker)
        raise ShardError(kind, message, counted=True, metadata=metadata)

    def count(self, reason: str, worker: WorkerRecord | None = None) -> None:
        with self._lock:
            self._counts[reason] = self._counts.get(reason, 0) + 1
            self._observer.rejected(reason, worker)

    def counts(self) -> dict[str, int]:
        """A copy of the counts so far."""
        with self._lock:
            return dict(self._counts)
