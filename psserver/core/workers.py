"""What the shard remembers about each worker: pulls, pushes, staleness, push ids.

A worker's push-id memory belongs to its *name*, not to its worker id: a worker that re-joins
(after an eviction, a network failure or a server restart from a checkpoint) with the same
name and ``resume`` keeps it, so a push it retries is still recognised and never applied twice.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

# Results of this many recent pushes are remembered per worker to answer retries verbatim; an
# older push id is answered from the watermark. A retry is of a push still in flight, and a
# worker has at most ``receiving.MAX_OPEN_PUSHES_PER_WORKER`` (2) open, so 64 is ample. Every
# checkpoint and every state a primary sends its backups carries them all, so this is a cost
# per replicated update (docs/operations.md, "What it costs").
RECENT_PUSHES_KEPT = 64


@dataclass
class PushOutcome:
    """What a push produced; replayed verbatim when the same push id is retried."""

    clock: int
    staleness: int
    telemetry: dict[str, float]
    duplicate: bool = False

    @property
    def local_steps(self) -> int:
        """The local steps the rule assigned the worker's next window (``UpdateRule.after_push``); 0 when none."""
        return int(self.telemetry.get("local_steps", 0.0))


@dataclass
class PushMemory:
    """Which push ids of one worker name were applied, and what the recent ones produced."""

    # Push ids at or below the watermark were applied (or are too old to be retried).
    watermark: int = -1
    recent: OrderedDict[int, PushOutcome] = field(default_factory=OrderedDict)

    def previous_outcome(self, push_id: int) -> PushOutcome | None:
        if push_id in self.recent:
            return self.recent[push_id]
        if push_id <= self.watermark:
            return PushOutcome(clock=-1, staleness=0, telemetry={})
        return None

    def record(self, push_id: int, outcome: PushOutcome) -> None:
        self.recent[push_id] = outcome
        while len(self.recent) > RECENT_PUSHES_KEPT:
            oldest, _ = self.recent.popitem(last=False)
            self.watermark = max(self.watermark, oldest)

    def to_state(self) -> dict[str, Any]:
        """Plain values (for checkpoints): the watermark and the recent outcomes."""
        return {
            "watermark": self.watermark,
            "recent": [[pid, o.clock, o.staleness, dict(o.telemetry)] for pid, o in self.recent.items()],
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> PushMemory:
        memory = cls(int(state["watermark"]))
        for pid, clock, staleness, telemetry in state["recent"]:
            values = {str(k): float(v) for k, v in telemetry.items()}
            memory.recent[int(pid)] = PushOutcome(int(clock), int(staleness), values)
        return memory


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
    memory: PushMemory = field(default_factory=PushMemory)

    @property
    def push_id_watermark(self) -> int:
        return self.memory.watermark

    @property
    def recent_pushes(self) -> OrderedDict[int, PushOutcome]:
        return self.memory.recent

    def previous_outcome(self, push_id: int) -> PushOutcome | None:
        """The outcome of an already applied push id, or None if it is new."""
        return self.memory.previous_outcome(push_id)

    def replay(self, previous: PushOutcome, clock: int) -> PushOutcome:
        """A retried push's answer: what it produced (the current ``clock`` when only the
        watermark remembers it), marked a duplicate, and counted."""
        self.duplicate_pushes += 1
        clock = previous.clock if previous.clock >= 0 else clock
        return PushOutcome(clock, previous.staleness, previous.telemetry, duplicate=True)

    def record_push(self, push_id: int, outcome: PushOutcome) -> None:
        self.pushes += 1
        self.staleness_sum += outcome.staleness
        self.max_staleness = max(self.max_staleness, outcome.staleness)
        self.last_staleness = outcome.staleness
        self.last_telemetry = outcome.telemetry
        self.memory.record(push_id, outcome)

    @property
    def mean_staleness(self) -> float:
        return self.staleness_sum / self.pushes if self.pushes else 0.0

    # Counters and identity kept in checkpoints (the push-id memory is saved per name).
    _SAVED = (
        "worker_id",
        "name",
        "device",
        "observer",
        "ssp_clock",
        "pulled_clock",
        "pulls",
        "pushes",
        "duplicate_pushes",
        "staleness_sum",
        "max_staleness",
        "last_staleness",
        "stats",
        "last_telemetry",
    )

    def to_state(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in self._SAVED}

    @classmethod
    def from_state(cls, state: dict[str, Any], memory: PushMemory, now: float) -> WorkerRecord:
        record = cls(int(state["worker_id"]), str(state["name"]), str(state["device"]), bool(state["observer"]))
        for key in cls._SAVED[4:]:
            setattr(record, key, state[key])
        record.memory = memory
        record.last_seen = now
        return record
