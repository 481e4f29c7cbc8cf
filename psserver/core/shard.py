"""One shard of the model, as an orchestrator over the components that own its state.

The ``Shard`` is the one public entry point and holds the one lock (and its condition) that
every component is used under; it sequences the components and does the waiting. Each
component owns its state and its job:

- ``model.Model``: the layout, the fp32 parameters, the rule and its state, the clock, Init;
- ``membership.Membership``: worker records, leases, eviction, push-id memories per name;
- ``scheduling.Scheduling``: does what the rule's scheduling hooks decide (waits, windows of
  local steps, holds on pulls), with the workers' paces they read (``local_steps``);
- ``admission`` (SSP waits, exclusive pulls, routing, pull sharing) and
  ``bsp_round.BspBarrier`` (the BSP round): pure decisions the shard acts on;
- ``request_checks``: every refusal of a request's header, as a decision;
- ``receiving.PushReceiver``: pending pushes, their buffers, ending slow pushes and streams;
- ``pull_versions.PullVersions``: the versions handed to pulls, one per clock and form, with
  the wire encoder injected by the transport (the core never builds wire bytes);
- ``shard_state``: the checkpoint form; ``refusals.Refusals``: every refusal counted and raised;
- ``observer.Observers``: the one hook mechanism (metrics; checkpoints via ``subscribe``);
- ``status``: what the shard reports, as immutable snapshots (``status()``).

Every request is validated completely before anything changes: a push is decoded into a
scratch receive buffer outside the lock and checked (coverage, dtype, finiteness), then applied
under the lock. Waiting (SSP's bound, BSP's barrier, what a rule's hook asks) happens on the one
condition (``waiting.Waiting``): waiters re-check leases so an evicted worker never stalls them,
and end within a slice once the transport says their client gave up (``abandoned``).

A push enters through one call, ``Shard.push``, which owns it to the end and returns its
outcome; every RPC form (psserver.rpc.servicer) and the in-process service (pstools.inprocess)
are thin adapters over it. A gradient's path through the server, in order: ``rpc.servicer``
parses the header into a ``receiving.PushHeader`` and each chunk message with psproto.wire, and
hands both to ``Shard.push``; the ``receiving.PendingPush`` it opens decodes each chunk with
``psproto.codec`` straight into its receive buffer; at the stream's end the shard checks the
buffer, admits the push and calls ``model.Model.apply``, which calls the rule's ``apply``.
"""

from __future__ import annotations

import threading
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
from psserver.core.waiting import Abandoned, Waiting
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
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._refusals = Refusals(self.observer)
        self._membership = Membership(self._refusals, config.lease_seconds, config.max_workers)
        self._receiver = PushReceiver(self._refusals, clock_source, config)
        self._versions = PullVersions(config.chunk_bytes, config.pull_versions, self._changed)
        self.snapshots = SnapshotStore(config.snapshot_memory_bytes)
        self._model = Model(
            config, self._refusals, self.snapshots, self._versions.freeze_before_update, self.observer.update_applied
        )
        self.started = self._now()
        self._barrier = BspBarrier()
        self._waiting = Waiting(self._changed, self._now, self._membership, self._evict_expired_locked, self._refusals)
        self._scheduling = Scheduling(
            self._now, self._membership, self._waiting, self.observer, config.exclusive_pull_seconds
        )

    # -- readable state (in-process callers; the transport uses ``status``, and ``length``) --

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
        """Forget a worker and release what it held: rule state (what others wait on), snapshots, the barrier."""
        worker = self._membership.remove(worker_id)
        self.observer.worker_left(worker, evicted)
        if self._model.rule is not None:
            self._model.rule.on_leave(worker_id)
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
        exclusive: bool = False,
        encoder: PullEncoder | None = None,
        abandoned: Abandoned | None = None,
    ) -> PullResult:
        """The parameters and their clock: serialised by ``encoder`` (the transport's), or in the
        in-process form without one; made once per clock, dtype and form.

        Under SSP the pull waits while the worker is too far ahead, and then for what its rule
        asks (``UpdateRule.pull_wait``). ``exclusive``: no other worker's push is applied until
        this worker's next push, for a rule that takes such pulls. A wait ends (ABANDONED,
        nothing taken) once ``abandoned`` says the client gave up.
        """
        self._refuse_if(checks.dtype_refusal(wire_dtype))
        wire_dtype = wire_dtype or codec.FLOAT32
        with self._lock:
            worker = self._membership.get(worker_id)
            self._require_initialized()
            rule = self._model.rule
            assert rule is not None
            self._waiting.until(worker, lambda: not self._versions.updates_waiting, abandoned)
            self._admit_pull(worker, rule, exclusive, abandoned)
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
    ) -> None:
        """Wait (lock held) while SSP holds the pull back, then for what the rule asks; then let the rule
        take the pull (an exclusive one holds the shard; a held one restarts the worker's window)."""
        if exclusive:
            self._refuse_if(admission.exclusive_pull_refusal(worker.observer, rule.exclusive_pull_refusal()), worker)
        consistency = self.config.consistency

        def ssp_allows() -> bool:
            live_clocks = [w.ssp_clock for w in self._membership.live()]
            return not admission.pull_must_wait(consistency, worker.observer, worker.ssp_clock, live_clocks)

        self._waiting.until(worker, ssp_allows, abandoned)
        self._scheduling.admit_pull(worker, rule, exclusive, abandoned)

    def pull_hold(self, worker_id: int) -> PullHold | None:
        """The hold on ``worker_id``'s next pull while it is not over (None: it would pull at once)."""
        with self._lock:
            self._membership.get(worker_id)
            return self._scheduling.pull_hold(self._model.rule, worker_id)

    def pull_hold_pending(self, worker_id: int) -> bool:
        """Whether ``worker_id``'s last push put a hold on its next pull that it has not pulled past."""
        with self._lock:
            return self._model.rule is not None and self._model.rule.pull_hold_pending(worker_id)

    # -- pushes -------------------------------------------------------------------------

    def push(
        self,
        header: PushHeader,
        chunks: Iterable[codec.ChunkLike],
        cancel: Callable[[], object] | None = None,
        abandoned: Abandoned | None = None,
    ) -> PushOutcome:
        """Take one push whole, and return its outcome: the only way a push enters the shard.

        The header is checked before anything is received (a PushPull's ``pull_dtype`` too, so a
        push is never applied and then answered with an error); a retried push id is answered with
        its first outcome, once its chunks are read; otherwise the chunks are decoded into a receive
        buffer, checked whole (coverage, finiteness), admitted (SSP/BSP, the rule's turn) and
        applied by the rule. The buffer is given back however the push ends.

        ``chunks`` is the transport's stream, read on the caller's thread: an error it raises while
        a limit has ended the push (its stream was cancelled as stalled) becomes that refusal
        (PUSH_STALLED). The transport's ``cancel`` ends its stream (an idle push); ``abandoned``
        says its client gave up, which ends its waits (``waiting`` keeps it exactly once)."""
        pending = self._open_push(header, cancel, abandoned)
        try:
            self._receive(pending, chunks)
            return self._commit(pending)
        finally:
            # A refused chunk, a broken stream or a refused commit must not keep its receive buffer.
            self._receiver.discard(pending)

    def _open_push(
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

    def _receive(self, pending: PendingPush, chunks: Iterable[codec.ChunkLike]) -> None:
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

    def _commit(self, pending: PendingPush) -> PushOutcome:
        """Apply a received push with the rule, or replay the outcome of a retried one."""
        with self._lock:
            self.observer.bytes_received(pending.worker, pending.bytes_received)
            if pending.replay is not None:
                return self._replay_locked(pending.worker, pending.replay)
        # The stream ended: no longer watched; a push a limit ended first is never applied.
        stalled = self._receiver.stalled(pending)
        if stalled is not None:
            raise stalled
        assembler = pending.decoder()
        check_complete(assembler, self._refusals, pending.worker)
        with self._lock:
            return self._commit_locked(pending, assembler.out)

    def _commit_locked(self, pending: PendingPush, update: torch.Tensor) -> PushOutcome:
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
            self._changed.notify_all()
            return self._commit_bsp(worker, pending, update)
        # A large shard's update lets the replies reading it finish (new pulls wait), not to copy it.
        wait = lambda ready, deadline: self._waiting.until(worker, ready, pending.abandoned, deadline)  # noqa: E731
        self._versions.let_replies_finish(self._model.params, self._now, wait)
        self._scheduling.admit_push(worker, rule, pending.abandoned)
        outcome, _ = self._model.apply(worker.worker_id, update, pending.kind, pending.base_clock, pending.metadata)
        self._scheduling.after_push(worker, rule, pending, outcome)
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
