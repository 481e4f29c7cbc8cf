"""One shard of the model, as an orchestrator over the components that own its state.

The ``Shard`` is the one public entry point and holds the one lock (its ``waiting.Signal``) that
every component is used under; it sequences the components and does the waiting. The components
and their jobs are listed in docs/architecture.md (model, membership, scheduling, admission and
bsp_round, request_checks, receiving, pull_versions, shard_state, refusals, observer, status).

Every request is validated completely before anything changes: a push is decoded into a
scratch receive buffer outside the lock and checked (coverage, dtype, finiteness), then applied
under the lock. Waiting (SSP's bound, BSP's barrier, what a rule's hook asks) is a pause in the
operation's steps (``waiting``: ``pull_steps``, ``commit_steps``), which the caller waits out on a
thread (``pull``, ``push``) or on an event loop (psserver.rpc.awaiting); waiters re-check leases
so an evicted worker never stalls them, and end within a slice once their client gave up.

A push enters through one call, ``Shard.push`` (for the transport, in its parts: ``open_push``,
``take_buffer_steps``, ``receive``, ``commit_steps``, ``discard_push``), which owns it to the end
and returns its outcome; every RPC form (psserver.rpc.servicer) and the in-process service
(pstools.inprocess) are thin adapters over it: each chunk decoded straight into a receive buffer
(``receiving.PendingPush``), checked whole, admitted, then applied by the rule (``model.Model``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, NoReturn

import torch

from psproto import codec
from psproto.inline_ops import inline_torch_ops
from psproto.layout import Layout
from psserver.core import admission, shard_state
from psserver.core import request_checks as checks
from psserver.core.admission import PushRoute
from psserver.core.bsp_round import BspBarrier
from psserver.core.config import ShardConfig
from psserver.core.errors import ErrorKind, ShardError
from psserver.core.held import Held
from psserver.core.membership import Membership
from psserver.core.model import Model
from psserver.core.observer import NullObserver, Observers, ShardObserver
from psserver.core.pull_versions import PullEncoder, PullResult, PullVersions
from psserver.core.receiving import PendingPush, PushHeader, PushReceiver, check_complete, decode_into
from psserver.core.refusals import Refusals
from psserver.core.rules import UpdateRule
from psserver.core.rules.base import PullHold
from psserver.core.rules.options import RuleOptions
from psserver.core.scheduling import Scheduling
from psserver.core.shard_state import StateError
from psserver.core.snapshots import SnapshotStore
from psserver.core.status import JoinResult, ShardStatus
from psserver.core.stream_watch import WatchedStream
from psserver.core.waiting import Abandoned, Signal, Steps, Waiting, run_blocking
from psserver.core.workers import PushOutcome, WorkerRecord

__all__ = ["JoinResult", "PendingPush", "PullResult", "PushHeader", "Shard", "ShardConfig", "StateError"]


class Shard:
    """The state one server process owns, and every operation on it."""

    def __init__(
        self,
        config: ShardConfig,
        clock_source: Callable[[], float] = time.monotonic,
        observer: ShardObserver | None = None,
    ) -> None:
        self.config = config
        self.observer = Observers(observer or NullObserver())
        self._now = clock_source
        # The one lock, and what waits for the shard to change (``waiting``: threads or an event loop).
        self._signal = Signal()
        self._lock = self._signal.lock
        self._refusals = Refusals(self.observer)
        self._membership = Membership(self._refusals, config.lease_seconds, config.max_workers)
        self._receiver = PushReceiver(self._refusals, clock_source, config)
        self._versions = PullVersions(config.chunk_bytes, config.pull_versions, self._signal)
        self.snapshots = SnapshotStore(config.snapshot_memory_bytes)
        self._model = Model(
            config, self._refusals, self.snapshots, self._versions.freeze_before_update, self.observer.update_applied
        )
        self.started = self._now()
        self._barrier = BspBarrier()
        self._waiting = Waiting(self._signal, self._now, self._membership, self._evict_expired_locked, self._refusals)
        self._scheduling = Scheduling(
            self._now, self._membership, self._waiting, self.observer, config.exclusive_pull_seconds
        )

    layout: Held[Layout | None] = Held("_model")
    length: Held[int] = Held("_model")  # 0 until a worker's layout is taken
    rule: Held[UpdateRule[RuleOptions] | None] = Held("_model")
    initialized: Held[bool] = Held("_model")
    clock: Held[int] = Held("_model")
    applied_pushes: Held[int] = Held("_model")
    workers: Held[dict[int, WorkerRecord]] = Held("_membership")
    evictions: Held[int] = Held("_membership")
    params: Held[torch.Tensor] = Held("_model", lock="_lock")

    @property
    def rejected(self) -> dict[str, int]:
        return self._refusals.counts()

    def busy(self) -> bool:
        return self._lock.locked()  # a call holds the lock now (it may be applying an update)

    def subscribe(self, observer: ShardObserver) -> Callable[[], None]:
        """Have ``observer`` hear every event too; returns the function that unsubscribes it."""
        return self.observer.add(observer)

    def status(self) -> ShardStatus:
        """A snapshot of the shard taken under its lock."""
        with self._lock:
            now = self._now()
            return ShardStatus.of(self._model, list(self._membership), self._refusals.counts(), now, now - self.started)

    def join(
        self, name: str, device: str, observer: bool, layout: Layout, layout_hash: str, resume: bool = False
    ) -> JoinResult:
        """Register a worker. With ``resume`` a worker of the same name continues: it keeps that
        name's push-id memory (retried pushes stay exactly-once) and replaces a record left behind.
        Without it, a name another joined worker uses is refused."""
        self._refuse_if(
            checks.join_refusal(name, device, layout, layout_hash, self.config.shard_index, self.config.num_shards)
        )
        with self._lock:
            self._model.adopt_or_check(layout)
            for replaced in self._membership.admission(name, resume, self._now()):
                self._remove(replaced, evicted=False)
            worker = self._membership.enrol(name, device, observer, resume, self._now())
            self.observer.worker_joined(worker)
            # A worker behind the others may hold their SSP pulls from now on.
            self._signal.notify_all()
            assert self._model.layout is not None and self._model.rule is not None
            options = MappingProxyType(self._model.rule.procedure_options())
            return JoinResult(worker, self._model.layout, self._model.clock, self._model.initialized, options)

    def heartbeat(self, worker_id: int, stats: Mapping[str, float]) -> int:
        self._refuse_if(checks.stats_refusal(stats))
        with self._lock:
            worker = self._membership.get(worker_id)
            worker.stats = dict(stats)
            worker.last_seen = self._now()
            self.observer.heartbeat(worker, stats)
            return self._model.clock

    def leave(self, worker_id: int) -> None:
        with self._lock:
            self._membership.get(worker_id)
            self._remove(worker_id, evicted=False)

    def evict_expired(self) -> list[WorkerRecord]:
        """Evict every worker silent for longer than the lease; returns them."""
        with self._lock:
            return self._evict_expired_locked()

    def _evict_expired_locked(self) -> list[WorkerRecord]:
        expired = self._membership.expire(self._now())
        for worker in expired:
            self._remove(worker.worker_id, evicted=True)
        return expired

    def _remove(self, worker_id: int, evicted: bool) -> None:
        """Forget a worker and release what it held: rule state (what others wait on), snapshots, the barrier."""
        worker = self._membership.remove(worker_id)
        self.observer.worker_left(worker, evicted)
        if self._model.rule is not None:
            self._model.rule.on_leave(worker_id)
        self.snapshots.retain_only(self._membership.pulled_clocks())
        # The barrier or the SSP minimum may have been waiting for this worker.
        self._maybe_finish_bsp_round()
        self._signal.notify_all()

    def worker_snapshot(self) -> list[WorkerRecord]:
        with self._lock:
            return list(self._membership)

    def begin_upload(self, worker_id: int, layout_hash: str) -> codec.Assembler:
        """Validate an Init header; the returned assembler collects the chunks."""
        with self._lock:
            worker = self._membership.get(worker_id)
            assert self._model.layout is not None
            self._refuse_if(
                checks.init_refusal(worker.observer, self._model.layout, layout_hash, self._model.initialized), worker
            )
            return codec.Assembler(torch.empty(self._model.length))

    def decode_chunk(
        self, assembler: codec.Assembler, chunk: codec.ChunkLike, worker: WorkerRecord | None = None
    ) -> None:
        decode_into(assembler, chunk, self._refusals, worker)

    def finish_upload(self, assembler: codec.Assembler) -> tuple[bool, int]:
        """Install uploaded initial parameters unless another Init already did; (applied, clock)."""
        check_complete(assembler, self._refusals)
        with self._lock:
            return self._model.install(assembler.out), self._model.clock

    def pull(
        self,
        worker_id: int,
        wire_dtype: int,
        exclusive: bool = False,
        encoder: PullEncoder | None = None,
        abandoned: Abandoned | None = None,
    ) -> PullResult:
        """``pull_steps`` waited out on this thread."""
        return run_blocking(self.pull_steps(worker_id, wire_dtype, exclusive, encoder, abandoned))

    def pull_steps(
        self,
        worker_id: int,
        wire_dtype: int,
        exclusive: bool = False,
        encoder: PullEncoder | None = None,
        abandoned: Abandoned | None = None,
    ) -> Steps[PullResult]:
        """The parameters and their clock: serialised by ``encoder`` (the transport's), or in the
        in-process form without one; made once per clock, dtype and form. Under SSP the pull waits
        while the worker is too far ahead, then for what its rule asks (``UpdateRule.pull_wait``).
        ``exclusive``: no other worker's push is applied until this worker's next push, for a rule
        that takes such pulls. A wait ends (ABANDONED, nothing taken) once ``abandoned`` says so."""
        self._refuse_if(checks.dtype_refusal(wire_dtype))
        wire_dtype = wire_dtype or codec.FLOAT32
        with self._lock:
            worker = self._membership.get(worker_id)
            self._require_initialized()
            rule = self._model.rule
            assert rule is not None
            yield from self._waiting.until(worker, lambda: not self._versions.updates_waiting, abandoned)
            yield from self._admit_pull(worker, rule, exclusive, abandoned)
            share = admission.may_share_version_in_flight(self.config.consistency.model)
            kept = (lambda old: self.snapshots.get(old) is not None) if rule.needs_snapshot else None
            result = self._versions.cached(self._model.clock, wire_dtype, encoder) or self._versions.newest_in_flight(
                wire_dtype, encoder, share, kept
            )
            clock = self._model.clock if result is None else result.clock
            worker.pulled_clock = clock
            worker.pulls += 1
            worker.last_seen = self._now()
            rule.on_pull(worker_id)
            self.snapshots.retain_only(self._membership.pulled_clocks())
            if result is None:
                snapshot = self.snapshots.get(clock)
                if snapshot is None and rule.needs_snapshot:
                    snapshot = self._model.params.clone()
                    for dropped in self.snapshots.keep(clock, snapshot):
                        self.observer.snapshot_dropped(dropped)
                made = self._versions.begin(clock, wire_dtype, encoder, self._model.params, snapshot)
                result = made if isinstance(made, PullResult) else None
            if result is not None:
                self.observer.pulled(worker, clock, result.data_bytes)
                return result
        assert isinstance(made, torch.Tensor)
        # A snapshot or a private copy: nobody changes it, so it is encoded outside the lock.
        result = self._versions.encode(made, clock, wire_dtype, encoder)
        with self._lock:
            self.observer.pulled(worker, clock, result.data_bytes)
            self._versions.keep(result, current=clock == self._model.clock)
        return result

    def _admit_pull(
        self, worker: WorkerRecord, rule: UpdateRule[RuleOptions], exclusive: bool, abandoned: Abandoned | None
    ) -> Steps[None]:
        """Wait while SSP holds the pull back, then for what the rule asks; then the rule takes the pull."""
        if exclusive:
            self._refuse_if(admission.exclusive_pull_refusal(worker.observer, rule.exclusive_pull_refusal()), worker)
        consistency = self.config.consistency

        def ssp_allows() -> bool:
            slowest = self._membership.slowest_clock(self._signal.changes)
            return not admission.pull_must_wait(consistency, worker.observer, worker.ssp_clock, slowest)

        yield from self._waiting.until(worker, ssp_allows, abandoned)
        yield from self._scheduling.admit_pull(worker, rule, exclusive, abandoned)

    def pull_hold(self, worker_id: int) -> PullHold | None:
        """The hold on ``worker_id``'s next pull while it is not over (None: it would pull at once)."""
        with self._lock:
            self._membership.get(worker_id)
            return self._scheduling.pull_hold(self._model.rule, worker_id)

    def pull_hold_pending(self, worker_id: int) -> bool:
        """Whether ``worker_id``'s last push put a hold on its next pull that it has not pulled past."""
        with self._lock:
            return self._model.rule is not None and self._model.rule.pull_hold_pending(worker_id)

    def push(
        self,
        header: PushHeader,
        chunks: Iterable[codec.ChunkLike],
        cancel: Callable[[], object] | None = None,
        abandoned: Abandoned | None = None,
    ) -> PushOutcome:
        """One push whole, and its outcome: the header checked before anything is received, a retried
        push id answered with its first outcome, else the chunks decoded into a receive buffer, checked
        whole, admitted (SSP/BSP, the rule's turn) and applied. An error ``chunks`` raises once a limit
        ended the push becomes that refusal (PUSH_STALLED); ``cancel`` ends the transport's stream (an
        idle push); ``abandoned`` says its client gave up, which ends its waits (exactly once kept)."""
        return run_blocking(self.push_steps(header, chunks, cancel, abandoned))

    def push_steps(
        self,
        header: PushHeader,
        chunks: Iterable[codec.ChunkLike],
        cancel: Callable[[], object] | None = None,
        abandoned: Abandoned | None = None,
    ) -> Steps[PushOutcome]:
        """``push`` as steps: it pauses for a receive buffer and for its turn."""
        pending = self.open_push(header, cancel, abandoned)
        try:
            yield from self.take_buffer_steps(pending)
            self.receive(pending, chunks)
            return (yield from self.commit_steps(pending))
        finally:
            # A refused chunk, a broken stream or a refused commit must not keep its receive buffer.
            self.discard_push(pending)

    def open_push(
        self, header: PushHeader, cancel: Callable[[], object] | None, abandoned: Abandoned | None
    ) -> PendingPush:
        """Check a push's header; the pending push that takes its chunks (``replay`` set for a retried id)."""
        if header.pull_dtype is not None:
            self._refuse_if(checks.dtype_refusal(header.pull_dtype))
        self._refuse_if(checks.metadata_refusal(header.metadata))
        with self._lock:
            worker = self._membership.get(header.worker_id)
            model = self._model
            assert model.layout is not None and model.rule is not None
            refusal = checks.push_refusal(
                worker.observer, header.layout_hash, model.layout, model.initialized, header.kind, model.rule,
                header.base_clock, model.clock,
            )  # fmt: skip
            self._refuse_if(refusal, worker)
            worker.last_seen = self._now()
            # A push the rule lets others wait on never queues for a buffer behind them.
            holder = model.rule.push_has_priority(worker.worker_id, self._now())
            previous = worker.previous_outcome(header.push_id)
            return self._receiver.open(worker, header, self._model.length, previous, holder, cancel, abandoned)

    def take_buffer_steps(self, pending: PendingPush) -> Steps[None]:
        return self._receiver.take_buffer_steps(pending)  # waits for one to come free (none for a replay)

    def push_stalled(self, pending: PendingPush) -> ShardError | None:
        """The refusal of a push a limit ended (its stream was cancelled for it), or None."""
        return self._receiver.stalled(pending)

    def discard_push(self, pending: PendingPush) -> None:
        """Give back what ``pending`` holds, however it ended."""
        self._receiver.discard(pending)

    def receive(self, pending: PendingPush, chunks: Iterable[codec.ChunkLike]) -> None:
        """Decode every chunk into ``pending``'s receive buffer, chunk by chunk on this thread (the
        rule's apply, later, keeps torch's threads)."""
        try:
            with inline_torch_ops():
                for chunk in chunks:
                    pending.add(chunk)
        except ShardError:
            raise
        except Exception:
            # The transport's stream broke. A limit that ended the push cancelled it: say so (the
            # call then ends CANCELLED with its reason, not with an unknown error).
            stalled = self._receiver.stalled(pending)
            if stalled is not None:
                raise stalled from None
            raise

    def cancel_stalled_pushes(self) -> list[PendingPush]:
        """End the pushes and streams past a limit (the server's reaper calls it; ``receiving``)."""
        return self._receiver.cancel_stalled()

    def watch_stream(self, worker_id: int, rpc: str, cancel: Callable[[], object]) -> WatchedStream:
        """Watch an Init upload or pull reply of a joined worker for the push limits (``stream_watch``)."""
        with self._lock:
            worker = self._membership.get(worker_id)
        return self._receiver.streams.watch(worker, rpc, cancel)

    def count_rejected(self, reason: str, worker: WorkerRecord | None = None) -> None:
        """Count a refused request (Status and metrics), also ones refused before the shard (auth)."""
        self._refusals.count(reason, worker)

    def commit_steps(self, pending: PendingPush) -> Steps[PushOutcome]:
        """Apply a received push with the rule, or replay the outcome of a retried one."""
        with self._lock:
            self.observer.bytes_received(pending.worker, pending.bytes_received)
            if pending.replay is not None:
                return self._replay_locked(pending.worker, pending.replay)
        # The stream ended: no longer watched; a push a limit ended first is never applied.
        stalled = self._receiver.stalled(pending)
        if stalled is not None:
            raise stalled
        yield from self._receiver.take_buffer_steps(pending)
        assembler = pending.decoder()
        check_complete(assembler, self._refusals, pending.worker)
        with self._lock:
            return (yield from self._commit_locked(pending, assembler.out))

    def _commit_locked(self, pending: PendingPush, update: torch.Tensor) -> Steps[PushOutcome]:
        worker = self._membership.get(pending.worker.worker_id)
        previous = worker.previous_outcome(pending.push_id)
        if previous is not None:
            return self._replay_locked(worker, previous)
        rule = self._model.rule
        assert rule is not None
        if admission.push_route(self.config.consistency.model) is PushRoute.BSP_ROUND:
            # A BSP push is only added to the round, so it waits for no turn: taken now, it ends what
            # it held (an exclusive pull), or the others' would wait for it to lapse every round.
            rule.push_taken(worker.worker_id)
            self._signal.notify_all()
            return (yield from self._commit_bsp(worker, pending, update))
        # A large shard's update lets the replies reading it finish (new pulls wait), not to copy it.
        wait = lambda ready, deadline: self._waiting.until(worker, ready, pending.abandoned, deadline)  # noqa: E731
        yield from self._versions.let_replies_finish(self._model.params, self._now, wait)
        yield from self._scheduling.admit_push(worker, rule, pending.abandoned)
        outcome, _ = self._model.apply(worker.worker_id, update, pending.kind, pending.base_clock, pending.metadata)
        self._scheduling.after_push(worker, rule, pending, outcome)
        worker.record_push(pending.push_id, outcome)
        self.observer.push_applied(worker, outcome)
        worker.ssp_clock += 1
        self.observer.update_committed(self._model.clock, self._state_locked)
        self._signal.notify_all()
        return outcome

    def _commit_bsp(self, worker: WorkerRecord, pending: PendingPush, update: torch.Tensor) -> Steps[PushOutcome]:
        """Add this worker's update to the round and wait until the round's mean is applied."""
        contribution = self._barrier.contribute(worker, pending.push_id, pending.kind, update, self._model.clock)
        if isinstance(contribution, str):
            self._refuse(ErrorKind.BAD_REQUEST, contribution, worker)
        # Given back before the barrier: waiting contributors must not hold every buffer.
        self._receiver.discard(pending)
        self._maybe_finish_bsp_round()
        yield from self._waiting.until(
            worker, lambda: self._barrier.finished(contribution.round_number), pending.abandoned
        )
        outcome = worker.previous_outcome(pending.push_id)
        assert outcome is not None
        return self._replay_locked(worker, outcome) if contribution.retried else outcome

    def _maybe_finish_bsp_round(self) -> None:
        current = self._barrier.due([w.worker_id for w in self._membership.live()])
        if current is None:
            return
        joined = [wid for wid in current.contributors if wid in self._membership]
        if joined:
            first = self._membership.workers[joined[0]]
            outcome, _ = self._model.apply(
                first.worker_id, current.mean(), current.kind, self._model.clock, {"workers": float(len(joined))}
            )
            for contributor in current.record(outcome, self._membership.workers):
                self.observer.push_applied(contributor, outcome)
        self._barrier.advance()
        if joined:
            self.observer.update_committed(self._model.clock, self._state_locked)
            self._signal.notify_all()

    def _replay_locked(self, worker: WorkerRecord, previous: PushOutcome) -> PushOutcome:
        outcome = worker.replay(previous, self._model.clock)
        self.observer.push_duplicate(worker)
        return outcome

    def _refuse(self, kind: ErrorKind, message: str, worker: WorkerRecord | None = None) -> NoReturn:
        self._refusals.refuse(kind, message, worker)

    def _refuse_if(self, refusal: checks.Refusal | None, worker: WorkerRecord | None = None) -> None:
        if refusal is not None:
            self._refusals.refuse(refusal.kind, refusal.message, worker)

    def _require_initialized(self) -> None:
        if not self._model.initialized:
            self._refuse_if(checks.NOT_INITIALIZED)

    def state_dict(self, copy: shard_state.Copier = shard_state.clone) -> dict[str, Any]:
        """A consistent copy of everything needed to resume: parameters, rule state, clocks,
        workers and their push-id memories (``shard_state``; ``copy`` makes the tensors' copies). A
        BSP round still collecting is not included: its pushes were not acknowledged, so their
        workers retry them."""
        with self._lock:
            return self._state_locked(copy)

    def _state_locked(self, copy: shard_state.Copier = shard_state.clone) -> dict[str, Any]:
        model, membership = self._model, self._membership.state_dict()
        tensors = (model.params, model.rule_state())
        return shard_state.capture(self.config, model.layout, tensors, model.counters(), membership, copy)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what ``state_dict`` returned, into a shard that has seen no worker yet.

        Raises ``StateError`` (nothing changed) when the state belongs to another rule, shard
        index, shard count or format, or its tensors do not fit its layout."""
        with shard_state.damage_as_state_error(), self._lock:
            shard_state.check_belongs(state, self.config)
            if self._model.layout is not None or self._membership.workers:
                raise StateError("state can only be restored into a shard no worker has joined yet")
            self._model.load(shard_state.parameter_state(state, self.config), state)
            self._membership.load_state_dict(state, self._now())
            self._versions.clear()
            for record in self._membership:
                self.observer.worker_joined(record)
