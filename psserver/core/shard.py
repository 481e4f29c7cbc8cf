"""One shard of the model: its parameters, the rule's state, the clock and the workers.

The shard validates every request completely before it changes anything: uploads are
decoded into scratch buffers outside the lock, checked (coverage, dtype, finiteness), and
only then applied under the lock. Serialising a pull happens outside the lock too.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NoReturn

import torch

from psproto import codec
from psproto.layout import Layout, LayoutError
from psproto.v1 import ps_pb2
from psserver.core.errors import ErrorKind, ShardError
from psserver.core.rules import PayloadKind, PushContext, RuleSpec, UpdateRule
from psserver.core.rules.options import RuleOptions
from psserver.core.workers import PushOutcome, WorkerRecord


@dataclass(frozen=True)
class ShardConfig:
    rule: RuleSpec
    shard_index: int = 0
    num_shards: int = 1
    lease_seconds: float = 30.0
    chunk_bytes: int = codec.DEFAULT_CHUNK_BYTES


@dataclass(frozen=True)
class JoinResult:
    worker: WorkerRecord
    layout: Layout
    clock: int
    initialized: bool


@dataclass(frozen=True)
class PullResult:
    clock: int
    total_length: int
    chunks: list[ps_pb2.Chunk]


@dataclass
class PendingPush:
    """A push whose header passed validation; chunks are decoded into ``buffer``."""

    worker: WorkerRecord
    push_id: int
    base_clock: int
    kind: PayloadKind
    metadata: dict[str, float]
    assembler: codec.Assembler | None
    replay: PushOutcome | None = None


class Shard:
    """The state one server process owns, and every operation on it."""

    def __init__(self, config: ShardConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._rejected_lock = threading.Lock()
        self._ids = itertools.count(1)
        self.layout: Layout | None = None
        self.rule: UpdateRule[RuleOptions] | None = None
        self.params = torch.empty(0)
        self.initialized = False
        self.clock = 0
        self.applied_pushes = 0
        self.workers: dict[int, WorkerRecord] = {}
        self.rejected: dict[str, int] = {}
        self.started = time.monotonic()
        self._segments: tuple[tuple[int, int], ...] = ()
        # Serialised parameters of the latest clock, shared by every worker pulling it.
        self._pull_cache: dict[tuple[int, int], list[ps_pb2.Chunk]] = {}
        # Exact parameters at the clocks workers pulled, for rules that need snapshots.
        self._snapshots: dict[int, torch.Tensor] = {}

    # -- membership -------------------------------------------------------------------

    def join(self, name: str, device: str, observer: bool, layout: Layout, layout_hash: str) -> JoinResult:
        if layout_hash and layout_hash != layout.hash:
            self._refuse(
                ErrorKind.LAYOUT_MISMATCH,
                f"layout_hash {layout_hash} does not match the layout sent ({layout.hash}); "
                "compute it as docs/protocol.md describes",
            )
        if layout.num_shards != self.config.num_shards:
            self._refuse(
                ErrorKind.LAYOUT_MISMATCH,
                f"the worker expects {layout.num_shards} shard(s) but this server is shard "
                f"{self.config.shard_index} of {self.config.num_shards}; start the worker with the same shard count",
            )
        with self._lock:
            if self.layout is None:
                self._adopt_layout(layout)
            elif layout.hash != self.layout.hash:
                self._refuse(
                    ErrorKind.LAYOUT_MISMATCH,
                    f"this server holds a model with layout {self.layout.hash[:12]} "
                    f"({len(self.layout.specs)} tensors, {self.layout.total_length} parameters); the worker "
                    f"sent layout {layout.hash[:12]} ({len(layout.specs)} tensors, {layout.total_length} "
                    "parameters). Use the same model on every worker",
                )
            worker = WorkerRecord(next(self._ids), name, device, observer)
            self.workers[worker.worker_id] = worker
            assert self.layout is not None
            return JoinResult(worker, self.layout, self.clock, self.initialized)

    def _adopt_layout(self, layout: Layout) -> None:
        try:
            shard = layout.shard(self.config.shard_index)
            segments = layout.segments(self.config.shard_index)
        except LayoutError as error:
            self._refuse(ErrorKind.LAYOUT_MISMATCH, str(error))
        self.layout = layout
        self.params = torch.zeros(shard.length)
        self._segments = segments
        self.rule = self.config.rule.build(shard.length)

    def heartbeat(self, worker_id: int, stats: Mapping[str, float]) -> int:
        with self._lock:
            worker = self._worker(worker_id)
            worker.stats = dict(stats)
            worker.touch()
            return self.clock

    def leave(self, worker_id: int) -> None:
        with self._lock:
            self._worker(worker_id)
            del self.workers[worker_id]
            if self.rule is not None:
                self.rule.on_leave(worker_id)
            self._drop_unused_snapshots()

    # -- parameters -------------------------------------------------------------------

    def begin_upload(self, worker_id: int, layout_hash: str) -> codec.Assembler:
        """Validate an Init header; the returned assembler collects the chunks."""
        with self._lock:
            self._worker(worker_id)
            assert self.layout is not None
            if layout_hash != self.layout.hash:
                if self.initialized:
                    self._refuse(
                        ErrorKind.INIT_CONFLICT,
                        f"parameters were already initialised with layout {self.layout.hash[:12]}; this Init "
                        f"carries layout {layout_hash[:12] or '(none)'}. Pull the existing parameters instead",
                    )
                self._refuse(
                    ErrorKind.LAYOUT_MISMATCH,
                    f"Init carries layout {layout_hash[:12] or '(none)'} but the worker joined with "
                    f"{self.layout.hash[:12]}",
                )
            return codec.Assembler(torch.empty(self.params.numel()))

    def finish_upload(self, assembler: codec.Assembler) -> tuple[bool, int]:
        """Install uploaded initial parameters unless another Init already did; (applied, clock)."""
        self._check_complete(assembler)
        with self._lock:
            if self.initialized:
                return False, self.clock
            self.params.copy_(assembler.out)
            self.initialized = True
            return True, self.clock

    def pull(self, worker_id: int, wire_dtype: int) -> PullResult:
        self._check_dtype(wire_dtype)
        wire_dtype = wire_dtype or ps_pb2.DTYPE_FLOAT32
        with self._lock:
            worker = self._worker(worker_id)
            self._require_initialized()
            clock = self.clock
            worker.pulled_clock = clock
            worker.pulls += 1
            worker.touch()
            assert self.rule is not None
            self.rule.on_pull(worker_id)
            self._drop_unused_snapshots()
            cached = self._pull_cache.get((clock, wire_dtype))
            if cached is not None:
                return PullResult(clock, self.params.numel(), cached)
            copy = self._snapshots.get(clock)
            if copy is None:
                copy = self.params.clone()
                if self.rule.needs_snapshot:
                    self._snapshots[clock] = copy
        chunks = list(codec.encode(copy, wire_dtype, self.config.chunk_bytes))
        with self._lock:
            if clock == self.clock:
                self._pull_cache = {k: v for k, v in self._pull_cache.items() if k[0] == clock}
                self._pull_cache[(clock, wire_dtype)] = chunks
        return PullResult(clock, copy.numel(), chunks)

    def begin_push(
        self,
        worker_id: int,
        push_id: int,
        base_clock: int,
        kind: int,
        layout_hash: str,
        metadata: Mapping[str, float],
    ) -> PendingPush:
        """Validate a push header. A retried push id comes back with ``replay`` set."""
        with self._lock:
            worker = self._worker(worker_id)
            assert self.layout is not None and self.rule is not None
            if worker.observer:
                self._refuse(ErrorKind.BAD_REQUEST, "observers cannot push; join with role ROLE_WORKER")
            if layout_hash != self.layout.hash:
                self._refuse(
                    ErrorKind.LAYOUT_MISMATCH,
                    f"push carries layout {layout_hash[:12] or '(none)'} but this shard holds "
                    f"{self.layout.hash[:12]}; set layout_hash to the one used at Join",
                )
            self._require_initialized()
            try:
                payload = PayloadKind(kind)
            except ValueError:
                self._refuse(ErrorKind.BAD_REQUEST, f"push kind {kind} is unknown; use GRADIENT or DELTA")
            if payload not in self.rule.accepted_kinds:
                accepted = ", ".join(k.name for k in sorted(self.rule.accepted_kinds))
                self._refuse(
                    ErrorKind.BAD_REQUEST,
                    f"rule {self.rule.name} does not take {payload.name} pushes; it takes {accepted} "
                    f"(worker procedure {self.rule.worker_procedure!r})",
                )
            if base_clock > self.clock:
                self._refuse(
                    ErrorKind.FUTURE_CLOCK,
                    f"base_clock {base_clock} is ahead of the shard's clock {self.clock}; "
                    "send the clock of the parameters the update was computed on",
                )
            worker.touch()
            previous = worker.previous_outcome(push_id)
            if previous is not None:
                return PendingPush(worker, push_id, base_clock, payload, dict(metadata), None, previous)
            return PendingPush(
                worker, push_id, base_clock, payload, dict(metadata), codec.Assembler(torch.empty(self.params.numel()))
            )

    def add_chunk(self, pending: PendingPush, chunk: ps_pb2.Chunk) -> None:
        """Decode one chunk of a push or an upload (outside the lock)."""
        if pending.assembler is not None:
            self.decode_chunk(pending.assembler, chunk)

    def decode_chunk(self, assembler: codec.Assembler, chunk: ps_pb2.Chunk) -> None:
        try:
            assembler.add(chunk)
        except codec.CodecError as error:
            kind = {
                "unknown_dtype": ErrorKind.UNKNOWN_DTYPE,
                "chunk_out_of_range": ErrorKind.CHUNK_OUT_OF_RANGE,
            }.get(error.reason, ErrorKind.WRONG_LENGTH)
            self._refuse(kind, str(error))

    def commit_push(self, pending: PendingPush) -> PushOutcome:
        """Apply a validated push with the rule, or replay the outcome of a retried one."""
        if pending.replay is not None:
            return self._replay(pending, pending.replay)
        assert pending.assembler is not None
        self._check_complete(pending.assembler)
        update = pending.assembler.out
        with self._lock:
            worker = self.workers.get(pending.worker.worker_id)
            if worker is None:
                self._refuse(ErrorKind.UNKNOWN_WORKER, f"worker {pending.worker.worker_id} left during its push")
            previous = worker.previous_outcome(pending.push_id)
            if previous is not None:
                return self._replay(pending, previous)
            assert self.rule is not None
            staleness = self.clock - pending.base_clock
            snapshots = self._snapshots
            base_clock = pending.base_clock
            ctx = PushContext(
                worker_id=worker.worker_id,
                staleness=staleness,
                kind=pending.kind,
                segments=self._segments,
                metadata=pending.metadata,
                snapshot=lambda: snapshots.get(base_clock),
            )
            telemetry = self.rule.apply(self.params, update, ctx)
            self.clock += 1
            self.applied_pushes += 1
            outcome = PushOutcome(self.clock, staleness, {"staleness": float(staleness), **telemetry})
            worker.record_push(pending.push_id, outcome)
            return outcome

    def _replay(self, pending: PendingPush, previous: PushOutcome) -> PushOutcome:
        with self._lock:
            pending.worker.duplicate_pushes += 1
            return PushOutcome(
                clock=previous.clock if previous.clock >= 0 else self.clock,
                staleness=previous.staleness,
                telemetry=previous.telemetry,
                duplicate=True,
            )

    # -- helpers ----------------------------------------------------------------------

    def _check_complete(self, assembler: codec.Assembler) -> None:
        try:
            assembler.finish()
        except codec.CodecError as error:
            kind = ErrorKind.WRONG_LENGTH
            self._refuse(kind, str(error))
        if not torch.isfinite(assembler.out).all():
            bad = int((~torch.isfinite(assembler.out)).sum())
            self._refuse(ErrorKind.NON_FINITE, f"{bad} element(s) are NaN or Inf; nothing was applied")

    def _check_dtype(self, dtype: int) -> None:
        try:
            codec.wire_dtype(dtype)
        except codec.CodecError as error:
            self._refuse(ErrorKind.UNKNOWN_DTYPE, str(error))

    def _require_initialized(self) -> None:
        if not self.initialized:
            self._refuse(ErrorKind.NOT_INITIALIZED, "the parameters are not initialised yet; send Init first")

    def _worker(self, worker_id: int) -> WorkerRecord:
        worker = self.workers.get(worker_id)
        if worker is None:
            self._refuse(
                ErrorKind.UNKNOWN_WORKER,
                f"worker id {worker_id} is not joined to this shard (it never joined, left, or the "
                "server restarted); call Join again",
            )
        return worker

    def _refuse(self, kind: ErrorKind, message: str) -> NoReturn:
        with self._rejected_lock:
            self.rejected[kind.reason] = self.rejected.get(kind.reason, 0) + 1
        raise ShardError(kind, message)

    def _drop_unused_snapshots(self) -> None:
        wanted = {w.pulled_clock for w in self.workers.values()}
        for clock in [c for c in self._snapshots if c not in wanted]:
            del self._snapshots[clock]

    def uptime_seconds(self) -> float:
        return time.monotonic() - self.started

    def worker_snapshot(self) -> Iterable[WorkerRecord]:
        with self._lock:
            return list(self.workers.values())
