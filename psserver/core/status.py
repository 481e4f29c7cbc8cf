"""What a shard reports about itself: immutable snapshots taken under its lock.

The transport's Status reply and the CLI read these instead of the shard's live attributes,
which change while they are read.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from psproto.layout import Layout
from psserver.core.model import Model
from psserver.core.workers import WorkerRecord


@dataclass(frozen=True)
class JoinResult:
    """What a Join answers: the worker's record, the layout and where the shard stands."""

    worker: WorkerRecord
    layout: Layout
    clock: int
    initialized: bool
    # What the rule tells the worker's procedure.
    procedure_options: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class WorkerView:
    """One worker's record as it was when the snapshot was taken."""

    worker_id: int
    name: str
    device: str
    observer: bool
    pushes: int
    pulls: int
    duplicate_pushes: int
    last_staleness: int
    mean_staleness: float
    max_staleness: int
    seconds_since_seen: float
    stats: Mapping[str, float]
    last_telemetry: Mapping[str, float]

    @classmethod
    def of(cls, worker: WorkerRecord, now: float) -> WorkerView:
        return cls(
            worker_id=worker.worker_id,
            name=worker.name,
            device=worker.device,
            observer=worker.observer,
            pushes=worker.pushes,
            pulls=worker.pulls,
            duplicate_pushes=worker.duplicate_pushes,
            last_staleness=worker.last_staleness,
            mean_staleness=worker.mean_staleness,
            max_staleness=worker.max_staleness,
            seconds_since_seen=now - worker.last_seen,
            stats=MappingProxyType(dict(worker.stats)),
            last_telemetry=MappingProxyType(dict(worker.last_telemetry)),
        )


@dataclass(frozen=True)
class ShardStatus:
    clock: int
    # Empty until the first Join (or a restored checkpoint) gave the shard its layout.
    layout_hash: str
    initialized: bool
    shard_length: int
    applied_pushes: int
    rejected: Mapping[str, int]
    workers: tuple[WorkerView, ...]
    uptime_seconds: float
    # What the rule tells its workers' procedures (empty before the layout is known).
    procedure_options: Mapping[str, str]

    @classmethod
    def of(
        cls, model: Model, workers: list[WorkerRecord], rejected: Mapping[str, int], now: float, uptime: float
    ) -> ShardStatus:
        """The snapshot of these (the caller holds the shard lock)."""
        return cls(
            clock=model.clock,
            layout_hash=model.layout.hash if model.layout else "",
            initialized=model.initialized,
            shard_length=model.length,
            applied_pushes=model.applied_pushes,
            rejected=MappingProxyType(dict(rejected)),
            workers=tuple(WorkerView.of(w, now) for w in workers),
            uptime_seconds=uptime,
            procedure_options=MappingProxyType(model.rule.procedure_options() if model.rule else {}),
        )
