"""What the shard remembers about each worker: pulls, pushes, staleness, push ids."""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field

# Results of this many recent pushes are remembered per worker to answer retries.
RECENT_PUSHES_KEPT = 1024


@dataclass
class PushOutcome:
    """What a push produced; replayed verbatim when the same push id is retried."""

    clock: int
    staleness: int
    telemetry: dict[str, float]
    duplicate: bool = False


@dataclass
class WorkerRecord:
    worker_id: int
    name: str
    device: str
    observer: bool
    last_seen: float = field(default_factory=time.monotonic)
    # Pushes completed, as SSP counts them (a newcomer starts level with the slowest worker).
    ssp_clock: int = 0
    # True while one of its requests waits inside the shard (it is alive, not silent).
    waiting: bool = False
    pulled_clock: int = -1
    pulls: int = 0
    pushes: int = 0
    duplicate_pushes: int = 0
    staleness_sum: int = 0
    max_staleness: int = 0
    last_staleness: int = 0
    stats: dict[str, float] = field(default_factory=dict)
    last_telemetry: dict[str, float] = field(default_factory=dict)
    # Push ids at or below the watermark were applied (or are too old to be retried).
    push_id_watermark: int = -1
    recent_pushes: OrderedDict[int, PushOutcome] = field(default_factory=OrderedDict)

    def previous_outcome(self, push_id: int) -> PushOutcome | None:
        """The outcome of an already applied push id, or None if it is new."""
        if push_id in self.recent_pushes:
            return self.recent_pushes[push_id]
        if push_id <= self.push_id_watermark:
            return PushOutcome(clock=-1, staleness=0, telemetry={})
        return None

    def record_push(self, push_id: int, outcome: PushOutcome) -> None:
        self.pushes += 1
        self.staleness_sum += outcome.staleness
        self.max_staleness = max(self.max_staleness, outcome.staleness)
        self.last_staleness = outcome.staleness
        self.last_telemetry = outcome.telemetry
        self.recent_pushes[push_id] = outcome
        while len(self.recent_pushes) > RECENT_PUSHES_KEPT:
            oldest, _ = self.recent_pushes.popitem(last=False)
            self.push_id_watermark = max(self.push_id_watermark, oldest)

    @property
    def mean_staleness(self) -> float:
        return self.staleness_sum / self.pushes if self.pushes else 0.0
