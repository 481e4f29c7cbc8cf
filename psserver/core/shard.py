"""One shard of the model, as an orchestrator over the components that own its state.

The ``Shard`` is the one public entry point and holds the one lock (and its condition) that
every component is used under; it sequences the components and does the waiting. Each
component owns its state and its job:

- ``model.Model``: the layout, the fp32 parameters, the rule and its state, the clock, Init;
- ``membership.Membership``: worker records, leases, eviction, push-id memories per name;
- ``local_steps.LocalSteps``: DyLU, the workers' speeds and the local steps each push reply assigns;
- ``pull_hold``: Delayed Nesterov's ``pull_grace``, the hold a push puts on its worker's next pull;
- ``admission`` (SSP waits, GEM reservations, routing, pull sharing) and
  ``bsp_round.BspBarrier`` (the BSP round): pure decisions the shard acts on;
- ``request_checks``: every refusal of a request's header, as a decision;
- ``receiving.PushReceiver``: pending pushes, their buffers, ending slow pushes and streams;
- ``pull_versions.PullVersions``: the versions handed to pulls, one per clock and form, with
  the wire encoder injected by the transport (the core never builds wire bytes);
- ``span_apply``: an update applied as its PushPull's version is serialised (``apply_during_reply``);
- ``shard_state``: the checkpoint form; ``refusals.Refusals``: every refusal counted and raised;
- ``observer.Observers``: the one hook mechanism (metrics; checkpoints via ``subscribe``);
- ``status``: what the shard reports, as immutable snapshots (``status()``).

Every request is validated completely before anything changes: a push is decoded into a
scratch receive buffer outside the lock and checked (coverage, dtype, finiteness), then applied
under the lock. Waiting (SSP's bound, BSP's barrier, a GEM reservation) happens on the one
condition (``waiting.Waiting``): waiters re-check leases so an evicted worker never stalls them,
and end within a slice once the transport says their client gave up (``abandoned``).

A gradient's path through the server, in order: ``rpc.servicer`` parses each chunk message
(psproto.wire) and hands it to the ``receiving.PendingPush`` that ``Shard.begin_push`` returned;
``PendingPush.add`` decodes it with ``psproto.codec`` straight into its receive buffer; at the
stream's end the servicer calls ``Shard.commit_push``, which checks the buffer, admits the
push and calls ``model.Model.apply``, which calls the rule's ``apply`` on the parameters.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from functools import partial
from types import MappingProxyType
from typing import Any, NoReturn

import torch

from psproto import codec
from psproto.layout import Layout
from psserver.core import admission, shard_state
from psserver.core import request_checks as checks
from psserver.core.admission import NO_RESERVATION, PushRoute
from psserver.core.bsp_round import BspBarrier
from psserver.core.config import ShardConfig
from psserver.core.errors import ErrorKind, ShardError
from psserver.core.held import Held
from psserver.core.local_steps import LocalSteps
from psserver.core.membership import Membership
from psserver.core.model import Model
from psserver.core.observer import NullObserver, Observers, ShardObserver
from psserver.core.pull_hold import PullHold, PullHolds
from psserver.core.pull_versions import PullEncoder, PullResult, PullVersions
from psserver.core.receiving import PendingPush, PushReceiver, check_complete, decode_into
from psserver.core.refusals import Refusals
from psserver.core.rules import PayloadKind, UpdateRule
from psserver.core.rules.options import RuleOptions
from psserver.core.shard_state import StateError
from psserver.core.snapshots import SnapshotStore
from psserver.core.status import JoinResult, ShardStatus
from psserver.core.stream_watch import WatchedStream
from psserver.core.waiting import Abandoned, Waiting
from psserver.core.workers import PushOutcome, WorkerRecord

__all__ = ["JoinResult", "PendingPush", "PullResult", "Shard", "ShardConfig", "StateError"]


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
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._refusals = Refusals(self.observer)
        self._membership = Membership(self._refusals, config.lease_seconds, config.max_workers)
        self._receiver = PushReceiver(self._refusals, clock_source, config)
        self._versions = PullVersions(config.chunk_bytes, config.pull_versions, config.build_replies_ahead)
        self.snapshots = SnapshotStore(config.snapshot_memory_bytes)
        self._local_steps = LocalSteps.of(config)
        self._model = Model(
            config, self._refusals, self.snapshots, self._versions.freeze_before_update, self.observer.update_applied
        )
        self.started = self._now()
        self._barrier = BspBarrier()
        self._reservation = NO_RESERVATION
        self._waiting = Waiting(self._changed, self._now, self._membership, self._evict_expired_locked, self._refusals)
        self._pull_holds = PullHolds.of(config, self._now, self._membership.live, self._local_steps, self.observer)

    # -- readable state (in-process callers; the transport uses ``status``, and ``length``) --

    layout: Held[Layout | None] = Held("_model")
    length: Held[int] = Held("_model")  # 0 until a worker's layout is taken
    rule: Held[UpdateRule[RuleOptions] | None] = Held("_model")
    initialized: Held[bool] = Held("_model")
    clock: Held[int] = Held("_model")
    applied_pushes: Held[int] = Held("_model")
    workers: Held[dict[int, WorkerRecord]] = Held("_membership")
    evictions: Held[int] = Held("_membership")
    params: Held[torch.Tensor] = Held("_model", lock="_lock")  # an update still pending finished first

    @property
    def rejected(self) -> dict[str, int]:
        return self._refusals.counts()

    def subscribe(self, observer: ShardObserver) -> Callable[[], None]:
        """Have ``observer`` hear every event too; returns the function that unsubscribes it."""
        return self.observer.add(observer)

    def status(self) -> ShardStatus:
        """A snapshot of the shard taken under its lock."""
        with self._lock:
            now = self._now()
            return ShardStatus.of(self._model, list(self._membership), self._refusals.counts(), now, now - self.started)

    # -- membership -------------------------------------------------------------------

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
        """Forget a worker and release what it held: rule state, reservation, snapshots, the barrier."""
        worker = self._membership.remove(worker_id)
        self.observer.worker_left(worker, evicted)
        if self._model.rule is not None:
            self._model.rule.on_leave(worker_id)
        self._reservation = self._reservation.released_by(worker_id)
        self.snapshots.retain_only(self._membership.pulled_clocks())
        # The barrier or the SSP minimum may have been waiting for this worker.
        self._maybe_finish_bsp_round()
        self._changed.notify_all()

    def worker_snapshot(self) -> list[WorkerRecord]:
        with self._lock:
            return list(self._membership)

    # -- Init ---------------------------------------------------------------------------

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

    # -- pulls --------------------------------------------------------------------------

    def pull(
        self,
        worker_id: int,
        wire_dtype: int,
        reserve: bool = False,
        encoder: PullEncoder | None = None,
        abandoned: Abandoned | None = None,
    ) -> PullResult:
        """The parameters and their clock: serialised by ``encoder`` (the transport's), or in the
        in-process form without one; made once per clock, dtype and form.

        Under SSP the pull waits while the worker is too far ahead. With ``reserve`` (GEM's
        atomic mode) no other worker's push is applied until this worker's next push. A wait
        ends (ABANDONED, nothing taken) once ``abandoned`` says the client gave up.
        """
        self._refuse_if(checks.dtype_refusal(wire_dtype))
        wire_dtype = wire_dtype or codec.FLOAT32
        with self._lock:
            worker = self._membership.get(worker_id)
            self._require_initialized()
            rule = self._model.rule
            assert rule is not None
            self._admit_pull(worker, rule, reserve, abandoned)
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
                # A serialised version may read the parameters as an update is still being applied
                # to them span by span (the hook brings each range up to date before it is read).
                params, before_read = self._model.live_params() if encoder is not None else (self._model.params, None)
                made = self._versions.begin(clock, wire_dtype, encoder, params, snapshot, before_read)
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
        self, worker: WorkerRecord, rule: UpdateRule[RuleOptions], reserve: bool, abandoned: Abandoned | None
    ) -> None:
        """Wait (lock held) while SSP holds the pull back; with ``reserve``, take the GEM reservation."""
        if reserve:
            self._refuse_if(admission.reserve_refusal(worker.observer, rule.reserves_pulls, rule.name), worker)
        consistency = self.config.consistency

        def ssp_allows() -> bool:
            live_clocks = [w.ssp_clock for w in self._membership.live()]
            return not admission.pull_must_wait(consistency, worker.observer, worker.ssp_clock, live_clocks)

        self._waiting.until(worker, ssp_allows, abandoned)
        self._pull_holds.wait(worker, self._waiting, abandoned)
        if reserve:
            self._waiting.until(worker, lambda: self._reservation.admits(worker.worker_id, self._now()), abandoned)
            now = self._now()
            self._reservation = self._reservation.taken_by(worker.worker_id, now, self.config.reservation_seconds)

    def pull_hold(self, worker_id: int) -> PullHold | None:
        """The hold on ``worker_id``'s next pull while it is not over (None: it would pull at once)."""
        with self._lock:
            return self._pull_holds.active(self._membership.get(worker_id))

    # -- pushes -------------------------------------------------------------------------

    def begin_push(
        self,
        worker_id: int,
        push_id: int,
        base_clock: int,
        kind: int,
        layout_hash: str,
        metadata: Mapping[str, float],
        pull_dtype: int | None = None,
        cancel: Callable[[], object] | None = None,
        abandoned: Abandoned | None = None,
    ) -> PendingPush:
        """Validate a push header; the pending push returned takes the chunks (``PendingPush.add``).
        A retried push id comes back with ``replay`` set. The transport's ``cancel`` ends its stream
        (a stalled push); ``abandoned`` says its client gave up (ends its waits, ``commit_push``).

        ``pull_dtype``: the wire dtype of the parameters to send back after the push (PushPull),
        checked now so a push is never applied and then answered with an error."""
        if pull_dtype is not None:
            self._refuse_if(checks.dtype_refusal(pull_dtype))
        self._refuse_if(checks.metadata_refusal(metadata))
        with self._lock:
            worker = self._membership.get(worker_id)
            model = self._model
            assert model.layout is not None and model.rule is not None
            refusal = checks.push_refusal(
                worker.observer, layout_hash, model.layout, model.initialized, kind, model.rule, base_clock, model.clock
            )
            self._refuse_if(refusal, worker)
            worker.last_seen = self._now()
            # The holder of a GEM reservation never queues for a buffer behind pushes waiting for it.
            holder = self._reservation.holder_at(self._now()) == worker_id
            previous = worker.previous_outcome(push_id)
            pending = self._receiver.open(
                worker, push_id, base_clock, PayloadKind(kind), dict(metadata), self._model.length, previous, holder,
                cancel, abandoned,
            )  # fmt: skip
            pending.replies_with_params = pull_dtype is not None
            return pending

    # The receiving component's operations (``receiving.PushReceiver`` says what each does).
    def add_chunk(self, pending: PendingPush, chunk: codec.ChunkLike) -> None:
        pending.add(chunk)

    def stalled(self, pending: PendingPush) -> ShardError | None:
        return self._receiver.stalled(pending)

    def settle_apply(self) -> None:
        """Finish an update still being applied span by span (its reply was abandoned, or shared)."""
        with self._lock:
            self._model.settle()

    def close(self) -> None:
        """Stop the threads building replies ahead: the transport has stopped sending them."""
        self._versions.close()

    def cancel_stalled_pushes(self) -> list[PendingPush]:
        return self._receiver.cancel_stalled()

    def discard_push(self, pending: PendingPush) -> None:
        self._receiver.discard(pending)

    def watch_stream(self, worker_id: int, rpc: str, cancel: Callable[[], object]) -> WatchedStream:
        """Watch an Init upload or pull reply of a joined worker for the push limits (``stream_watch``)."""
        with self._lock:
            worker = self._membership.get(worker_id)
        return self._receiver.streams.watch(worker, rpc, cancel)

    def count_rejected(self, reason: str, worker: WorkerRecord | None = None) -> None:
        """Count a refused request (Status and metrics), also ones refused before the shard (auth)."""
        self._refusals.count(reason, worker)

    def commit_push(self, pending: PendingPush) -> PushOutcome:
        """Apply a validated push with the rule, or replay the outcome of a retried one. Its
        client giving up while it waits keeps it exactly once (``waiting`` says how)."""
        with self._lock:
            self.observer.bytes_received(pending.worker, pending.bytes_received)
        if pending.replay is not None:
            with self._lock:
                return self._replay_locked(pending.worker, pending.replay)
        try:
            # The stream ended: no longer watched; a push a limit ended first is never applied.
            stalled = self._receiver.stalled(pending)
            if stalled is not None:
                raise stalled
            assembler = pending.decoder()
            check_complete(assembler, self._refusals, pending.worker)
            with self._lock:
                return self._commit_locked(pending, assembler.out)
        finally:
            self._receiver.discard(pending)

    def _commit_locked(self, pending: PendingPush, update: torch.Tensor) -> PushOutcome:
        worker = self._membership.get(pending.worker.worker_id)
        previous = worker.previous_outcome(pending.push_id)
        if previous is not None:
            return self._replay_locked(worker, previous)
        if admission.push_route(self.config.consistency.model) is PushRoute.BSP_ROUND:
            # A BSP push is only added to the round, so it needs no turn: it ends its own GEM
            # reservation now, or the others' reserved pulls would wait for it to lapse every round.
            self._reservation = self._reservation.released_by(worker.worker_id)
            self._changed.notify_all()
            return self._commit_bsp(worker, pending, update)
        self._waiting.until(worker, lambda: self._reservation.admits(worker.worker_id, self._now()), pending.abandoned)
        self._reservation = self._reservation.released_by(worker.worker_id)
        # A reply follows: the model may keep the buffer until the update is applied span by span.
        hand_over = partial(self._receiver.hand_over, pending) if pending.replies_with_params else None
        outcome, _ = self._model.apply(
            worker.worker_id, update, pending.kind, pending.base_clock, pending.metadata, hand_over
        )
        worker.pull_hold = self._pull_holds.after_push(self._model.rule)
        self._local_steps.assign(worker, outcome, pending, self._now(), self._membership.live())
        worker.record_push(pending.push_id, outcome)
        self.observer.push_applied(worker, outcome)
        worker.ssp_clock += 1
        self.observer.update_committed(self._model.clock, self._state_locked)
        self._changed.notify_all()
        return outcome

    def _commit_bsp(self, worker: WorkerRecord, pending: PendingPush, update: torch.Tensor) -> PushOutcome:
        """Add this worker's update to the round and wait until the round's mean is applied."""
        contribution = self._barrier.contribute(worker, pending.push_id, pending.kind, update, self._model.clock)
        if isinstance(contribution, str):
            self._refuse(ErrorKind.BAD_REQUEST, contribution, worker)
        # Given back before the barrier: waiting contributors must not hold every buffer.
        self._receiver.discard(pending)
        self._maybe_finish_bsp_round()
        self._waiting.until(worker, lambda: self._barrier.finished(contribution.round_number), pending.abandoned)
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
            self._changed.notify_all()

    def _replay_locked(self, worker: WorkerRecord, previous: PushOutcome) -> PushOutcome:
        outcome = worker.replay(previous, self._model.clock)
        self.observer.push_duplicate(worker)
        return outcome

    # -- checks ------------------------------------------------------------------------

    def _refuse(self, kind: ErrorKind, message: str, worker: WorkerRecord | None = None) -> NoReturn:
        self._refusals.refuse(kind, message, worker)

    def _refuse_if(self, refusal: checks.Refusal | None, worker: WorkerRecord | None = None) -> None:
        if refusal is not None:
            self._refusals.refuse(refusal.kind, refusal.message, worker)

    def _require_initialized(self) -> None:
        if not self._model.initialized:
            self._refuse_if(checks.NOT_INITIALIZED)

    # -- saved state (checkpoints) -----------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """A consistent copy of everything needed to resume: parameters, rule state, clocks,
        workers and their push-id memories (``shard_state``). A BSP round still collecting is
        not included: its pushes were not acknowledged, so their workers retry them."""
        with self._lock:
            return self._state_locked()

    def _state_locked(self) -> dict[str, Any]:
        model, membership = self._model, self._membership.state_dict()
        return shard_state.capture(
            self.config, model.layout, model.params, model.rule_state(), model.counters(), membership
        )

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
