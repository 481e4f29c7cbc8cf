"""One shard of the model: its parameters, the rule's state, the clock and the workers.

The shard validates every request completely before it changes anything: uploads are
decoded into scratch buffers outside the lock, checked (coverage, dtype, finiteness), and
only then applied under the lock. A pull is serialised once per clock: straight from the
parameters under the lock (one copy, the same cost as cloning them), or outside the lock
from the snapshot a rule keeps anyway.

Waiting (SSP's bound, BSP's barrier, a GEM commit reservation) happens on one condition
variable over the shard lock; waiters re-check leases so an evicted worker never stalls them.
"""

from __future__ import annotations

import enum
import itertools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import torch

from psproto import codec, wire
from psproto.layout import Layout, LayoutError
from psproto.v1 import ps_pb2
from psserver.core.buffers import ReceiveBuffers
from psserver.core.consistency import Consistency, ConsistencyModel, bsp_round_complete, ssp_must_wait
from psserver.core.errors import ErrorKind, ShardError
from psserver.core.observer import NullObserver, ShardObserver
from psserver.core.request_limits import (
    MAX_DEVICE_CHARS,
    MAX_NAME_CHARS,
    non_finite_problem,
    numbers_problem,
    text_problem,
)
from psserver.core.rules import PayloadKind, PushContext, RuleSpec, Telemetry, UpdateRule
from psserver.core.rules.options import RuleOptions
from psserver.core.serialized_pull import MessageBuilder, SerializedPull
from psserver.core.snapshots import SnapshotStore
from psserver.core.workers import PushMemory, PushOutcome, WorkerRecord

_LOGGER = logging.getLogger(__name__)

# How often a waiting request wakes to re-check leases and its own deadline.
WAIT_SLICE_S = 0.2


@dataclass(frozen=True)
class ShardConfig:
    rule: RuleSpec
    shard_index: int = 0
    num_shards: int = 1
    lease_seconds: float = 30.0
    chunk_bytes: int = codec.DEFAULT_CHUNK_BYTES
    consistency: Consistency = field(default_factory=Consistency)
    snapshot_memory_bytes: int = 2 * 1024**3
    # A GEM atomic reservation lapses after this long if its holder never pushes.
    reservation_seconds: float = 10.0
    # Joined workers and observers at once; a Join past it is refused (RESOURCE_EXHAUSTED).
    max_workers: int = 1024
    # Elements one shard may hold; a first Join whose layout needs more is refused.
    max_parameters: int = 2**31
    # Pushes decoded at once, each into a buffer of the shard's size; more wait for a free one.
    receive_buffers: int = 2
    # How long a push waits for a receive buffer before it is refused (RESOURCE_EXHAUSTED).
    receive_wait_seconds: float = 120.0
    # A push holding a receive buffer that sends nothing for this long is cancelled, so a
    # stalled (or hostile) client cannot keep the buffer from everyone else.
    receive_idle_seconds: float = 30.0
    # Serialised parameter versions being sent at once (asynchronous training). At the limit a
    # pull gets the newest version already being sent instead of a newer one: the reply carries
    # that version's clock, so the worker's next push counts the extra staleness.
    pull_versions: int = 2


# Version of the dictionary ``Shard.state_dict`` returns (and checkpoints hold).
STATE_FORMAT = 1
# Push-id memories kept for names no joined worker uses (re-joining workers find theirs).
IDLE_MEMORIES_KEPT = 4096


class StateError(ValueError):
    """A saved state that does not fit this shard (another rule, shard or format)."""


@dataclass(frozen=True)
class JoinResult:
    worker: WorkerRecord
    layout: Layout
    clock: int
    initialized: bool


class PullForm(enum.Enum):
    """How a pull hands out the parameters."""

    PAYLOADS = "payloads"  # chunk views of a private copy, for callers in this process
    PULL_RESPONSE = "pull"  # serialised PullResponse messages
    PUSH_PULL_RESPONSE = "push_pull"  # serialised PushPullResponse messages carrying params


_MESSAGE_BUILDERS: dict[PullForm, MessageBuilder] = {
    PullForm.PULL_RESPONSE: wire.pull_response,
    PullForm.PUSH_PULL_RESPONSE: wire.push_pull_params,
}


@dataclass(frozen=True, eq=False)  # identity: results are tracked while being sent
class PullResult:
    clock: int
    total_length: int
    # PullForm.PAYLOADS fills ``chunks``; the serialised forms fill ``messages``.
    chunks: list[codec.ChunkPayload] = field(default_factory=list)
    messages: Sequence[bytes] | SerializedPull = ()
    data_bytes: int = 0
    wire_dtype: int = ps_pb2.DTYPE_FLOAT32
    form: PullForm = PullForm.PAYLOADS


@dataclass(eq=False)  # identity: the shard tracks the pushes holding receive buffers
class PendingPush:
    """A push whose header passed validation.

    Its chunks are decoded by ``assembler`` into a receive buffer taken at the first chunk and
    given back once the update is applied (or the push fails: ``Shard.discard_push``). A
    retried push id comes back with ``replay`` set and its chunks are ignored. ``cancel``
    (from the transport) ends the push's stream if it stalls while holding its buffer.
    """

    worker: WorkerRecord
    push_id: int
    base_clock: int
    kind: PayloadKind
    metadata: dict[str, float]
    replay: PushOutcome | None = None
    assembler: codec.Assembler | None = None
    buffers: ReceiveBuffers | None = None
    bytes_received: int = 0
    cancel: Callable[[], object] | None = None
    last_chunk_at: float = 0.0
    # Set (under the shard's receiving lock) when the push was cancelled as stalled: never applied then.
    cancelled: bool = False


@dataclass
class BspRound:
    """Updates collected for the current BSP clock."""

    total: torch.Tensor
    contributors: dict[int, int] = field(default_factory=dict)  # worker id -> push id
    # Whose push-id memory each contribution belongs to (a re-joined worker has a new id, same memory).
    owners: dict[int, PushMemory] = field(default_factory=dict)
    kind: PayloadKind = PayloadKind.GRADIENT  # set by the round's first push
    number: int = 0


class Shard:
    """The state one server process owns, and every operation on it."""

    def __init__(
        self,
        config: ShardConfig,
        clock_source: Callable[[], float] = time.monotonic,
        observer: ShardObserver | None = None,
    ) -> None:
        self.config = config
        self.observer: ShardObserver = observer or NullObserver()
        self._now = clock_source
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._rejected_lock = threading.Lock()
        self._ids = itertools.count(1)
        self.layout: Layout | None = None
        self.rule: UpdateRule[RuleOptions] | None = None
        self.params = torch.empty(0)
        self.initialized = False
        self.clock = 0
        self.applied_pushes = 0
        self.evictions = 0
        self.workers: dict[int, WorkerRecord] = {}
        self.rejected: dict[str, int] = {}
        self.started = self._now()
        self._segments: tuple[tuple[int, int], ...] = ()
        # The parameters of the latest clock in each requested form, shared by every worker pulling it.
        self._pull_cache: dict[tuple[int, int, PullForm], PullResult] = {}
        # Serialised pulls still referenced (being sent); the transport holds each until sent.
        self._live_pulls: weakref.WeakSet[PullResult] = weakref.WeakSet()
        self.snapshots = SnapshotStore(config.snapshot_memory_bytes)
        self._bsp: BspRound | None = None
        self._receive: ReceiveBuffers | None = None
        # Pushes holding a receive buffer while their chunks arrive (for ``cancel_stalled_pushes``).
        self._receiving: set[PendingPush] = set()
        self._receiving_lock = threading.Lock()
        self._reserved_by: int | None = None
        self._reserved_until = 0.0
        # Push-id memory per worker name, shared by every record of that name that resumed it.
        self._memories: dict[str, PushMemory] = {}
        # Called (lock held) with the state after every ``capture_every``-th update (checkpoints).
        self.capture_every = 0
        self.on_capture: Callable[[dict[str, Any]], None] | None = None

    # -- membership -------------------------------------------------------------------

    def join(
        self, name: str, device: str, observer: bool, layout: Layout, layout_hash: str, resume: bool = False
    ) -> JoinResult:
        """Register a worker. With ``resume`` a worker of the same name continues: it keeps that
        name's push-id memory (retried pushes stay exactly-once) and replaces a record left behind.
        Without it, a name another joined worker uses is refused."""
        for problem in (
            text_problem(name, "worker_name", MAX_NAME_CHARS),
            text_problem(device, "device", MAX_DEVICE_CHARS),
        ):
            if problem:
                self._refuse(ErrorKind.BAD_REQUEST, problem)
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
            namesake = next((w for w in self.workers.values() if w.name == name), None)
            if namesake is not None and not resume:
                # Two running workers under one name would share its push-id memory, and a
                # push one of them retries could be applied twice.
                silent = self._now() - namesake.last_seen
                self._refuse(
                    ErrorKind.NAME_IN_USE,
                    f"worker name {name!r} is in use by joined worker {namesake.worker_id} (last request "
                    f"{silent:.0f} s ago); give every worker a unique name. A stopped worker's record is evicted "
                    f"once it has been silent for {self.config.lease_seconds:g} s (--lease-seconds); a worker "
                    "continuing its own record joins with resume",
                )
            previous = [w.worker_id for w in self.workers.values() if resume and w.name == name]
            if len(self.workers) - len(previous) >= self.config.max_workers:
                self._refuse(
                    ErrorKind.LIMIT_REACHED,
                    f"this shard already has {len(self.workers)} joined workers and observers, its limit "
                    "(--max-workers); raise the limit or stop some workers",
                )
            for worker_id in previous:
                self._remove(worker_id, evicted=False)
            memory = self._memories.get(name) if resume else None
            if memory is None:
                memory = PushMemory()
                self._memories.pop(name, None)
                self._memories[name] = memory
                self._forget_idle_memories()
            worker = WorkerRecord(next(self._ids), name, device, observer, last_seen=self._now(), memory=memory)
            # A newcomer starts level with the slowest live worker so SSP neither stalls nor rushes it.
            worker.ssp_clock = min((w.ssp_clock for w in self._live_workers()), default=0)
            self.workers[worker.worker_id] = worker
            self.observer.worker_joined(worker)
            assert self.layout is not None
            return JoinResult(worker, self.layout, self.clock, self.initialized)

    def _forget_idle_memories(self) -> None:
        in_use = {w.name for w in self.workers.values()}
        idle = [name for name in self._memories if name not in in_use]
        for name in idle[: max(0, len(idle) - IDLE_MEMORIES_KEPT)]:
            del self._memories[name]

    def _adopt_layout(self, layout: Layout) -> None:
        try:
            shard = layout.shard(self.config.shard_index)
            segments = layout.segments(self.config.shard_index)
        except LayoutError as error:
            self._refuse(ErrorKind.LAYOUT_MISMATCH, str(error))
        if shard.length > self.config.max_parameters:
            self._refuse(
                ErrorKind.LIMIT_REACHED,
                f"the layout puts {shard.length} parameters on shard {self.config.shard_index}, more than its "
                f"limit of {self.config.max_parameters} (--max-parameters); use more shards or raise the limit",
            )
        self.layout = layout
        self.params = torch.zeros(shard.length)
        self._segments = segments
        self.rule = self.config.rule.build(shard.length)

    def heartbeat(self, worker_id: int, stats: Mapping[str, float]) -> int:
        problem = numbers_problem(stats, "stats")
        if problem:
            self._refuse(ErrorKind.BAD_REQUEST, problem)
        with self._lock:
            worker = self._worker(worker_id)
            worker.stats = dict(stats)
            worker.last_seen = self._now()
            self.observer.heartbeat(worker, stats)
            return self.clock

    def leave(self, worker_id: int) -> None:
        with self._lock:
            self._worker(worker_id)
            self._remove(worker_id, evicted=False)

    def evict_expired(self) -> list[WorkerRecord]:
        """Evict every worker silent for longer than the lease; returns them."""
        with self._lock:
            return self._evict_expired_locked()

    def _evict_expired_locked(self) -> list[WorkerRecord]:
        deadline = self._now() - self.config.lease_seconds
        expired = [w for w in self.workers.values() if w.last_seen < deadline and not w.waiting]
        for worker in expired:
            self._remove(worker.worker_id, evicted=True)
            self.evictions += 1
            _LOGGER.warning(
                "evicted worker %s (%s): silent for more than %.1f s; it may join again",
                worker.worker_id,
                worker.name,
                self.config.lease_seconds,
            )
        return expired

    def _remove(self, worker_id: int, evicted: bool) -> None:
        worker = self.workers.pop(worker_id)
        self.observer.worker_left(worker, evicted)
        if self.rule is not None:
            self.rule.on_leave(worker_id)
        if self._reserved_by == worker_id:
            self._reserved_by = None
        self.snapshots.retain_only(w.pulled_clock for w in self.workers.values())
        # The barrier or the SSP minimum may have been waiting for this worker.
        self._maybe_finish_bsp_round()
        self._changed.notify_all()

    # -- parameters -------------------------------------------------------------------

    def begin_upload(self, worker_id: int, layout_hash: str) -> codec.Assembler:
        """Validate an Init header; the returned assembler collects the chunks."""
        with self._lock:
            worker = self._worker(worker_id)
            if worker.observer:
                self._refuse(ErrorKind.BAD_REQUEST, "observers cannot Init; join with role ROLE_WORKER", worker)
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

    def pull(
        self, worker_id: int, wire_dtype: int, reserve: bool = False, form: PullForm = PullForm.PAYLOADS
    ) -> PullResult:
        """The parameters and their clock in ``form``, made once per clock, dtype and form.

        Under SSP the pull waits while the worker is too far ahead. With ``reserve`` (GEM's
        atomic mode) no other worker's push is applied until this worker's next push.
        """
        self._check_dtype(wire_dtype)
        wire_dtype = wire_dtype or ps_pb2.DTYPE_FLOAT32
        with self._lock:
            worker = self._worker(worker_id)
            self._require_initialized()
            if reserve:
                self._check_may_reserve(worker)
            self._wait_for_ssp(worker)
            if reserve:
                self._wait_until(worker, lambda: self._reservation_holder() in (None, worker.worker_id))
                if self._reserved_by != worker.worker_id:
                    # Pulling again does not extend a reservation: it lapses on time without a push.
                    self._reserved_by = worker.worker_id
                    self._reserved_until = self._now() + self.config.reservation_seconds
            assert self.rule is not None
            clock = self.clock
            key = (clock, wire_dtype, form)
            # Older versions live on only while being sent.
            self._pull_cache = {k: v for k, v in self._pull_cache.items() if k[0] == clock}
            result = self._pull_cache.get(key) or self._version_in_flight(wire_dtype, form)
            if result is not None:
                clock = result.clock
            worker.pulled_clock = clock
            worker.pulls += 1
            worker.last_seen = self._now()
            self.rule.on_pull(worker_id)
            self.snapshots.retain_only(w.pulled_clock for w in self.workers.values())
            if result is None:
                source = self.snapshots.get(clock)
                if source is None and self.rule.needs_snapshot:
                    source = self.params.clone()
                    for dropped in self.snapshots.keep(clock, source):
                        self.observer.snapshot_dropped(dropped)
                if source is None and form is PullForm.PAYLOADS:
                    source = self.params.clone()  # payload views need memory nobody changes
                elif source is None:
                    # Read from the live parameters as the messages are sent; frozen before a change.
                    result = self._encode_pull(self.params, clock, wire_dtype, form)
                    self._cache_pull(key, result)
            if result is not None:
                self.observer.pulled(worker, clock, result.data_bytes)
                return result
        assert source is not None  # a snapshot or a private copy: nobody changes it
        result = self._encode_pull(source, clock, wire_dtype, form)
        with self._lock:
            self.observer.pulled(worker, clock, result.data_bytes)
            if clock == self.clock:
                self._cache_pull(key, result)
            else:
                self._live_pulls.add(result)
        return result

    def _check_may_reserve(self, worker: WorkerRecord) -> None:
        """Only a worker of a rule that asks for reserved pulls (GEM's atomic mode) may hold off pushes."""
        assert self.rule is not None
        if worker.observer:
            self._refuse(ErrorKind.BAD_REQUEST, "observers cannot reserve the shard; pull without reserve", worker)
        if not self.rule.reserves_pulls:
            self._refuse(
                ErrorKind.BAD_REQUEST,
                f"rule {self.rule.name} with these options takes no reserved pulls (only gem with atomic=true "
                "does); pull without reserve",
                worker,
            )

    def _version_in_flight(self, wire_dtype: int, form: PullForm) -> PullResult | None:
        """The newest serialised version still being sent, when ``pull_versions`` are (lock held)."""
        if form is PullForm.PAYLOADS or self.config.consistency.model is not ConsistencyModel.ASYNC:
            return None
        live = [r for r in list(self._live_pulls) if r.wire_dtype == wire_dtype and r.form is form]
        if len({r.clock for r in live}) < self.config.pull_versions:
            return None
        newest = max(live, key=lambda r: r.clock)
        assert self.rule is not None
        if self.rule.needs_snapshot and self.snapshots.get(newest.clock) is None:
            return None
        return newest

    def _encode_pull(self, source: torch.Tensor, clock: int, wire_dtype: int, form: PullForm) -> PullResult:
        """``source`` in ``form``. Messages read from the live parameters are built under the shard's
        lock, and ``_freeze_pulls`` finishes them before the parameters change; a copy needs neither."""
        total = source.numel()
        if form is PullForm.PAYLOADS:
            payloads = list(codec.payloads(source, wire_dtype, self.config.chunk_bytes))
            return PullResult(clock, total, chunks=payloads, data_bytes=sum(len(p.data) for p in payloads))
        spans = codec.chunk_spans(total, wire_dtype, self.config.chunk_bytes)
        lock = self._lock if source is self.params else threading.Lock()
        messages = SerializedPull(source, clock, wire_dtype, spans, _MESSAGE_BUILDERS[form], lock)
        data_bytes = total * codec.element_size(wire_dtype)
        return PullResult(clock, total, messages=messages, data_bytes=data_bytes, wire_dtype=wire_dtype, form=form)

    def _freeze_pulls(self) -> None:
        """Before an update changes the parameters (lock held): every version still being sent from
        them gets its remaining messages built now. The cached forms of this clock are dropped first,
        being about to go stale, so a version no reply holds any more is not built for nothing."""
        self._pull_cache = {}
        for result in list(self._live_pulls):
            if isinstance(result.messages, SerializedPull) and result.messages.reads(self.params):
                result.messages.freeze()

    def _cache_pull(self, key: tuple[int, int, PullForm], result: PullResult) -> None:
        """Keep ``result`` for its clock; forms of older clocks are dropped (lock held)."""
        self._live_pulls.add(result)
        self._pull_cache = {k: v for k, v in self._pull_cache.items() if k[0] == key[0]}
        self._pull_cache[key] = result

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
    ) -> PendingPush:
        """Validate a push header. A retried push id comes back with ``replay`` set.

        ``pull_dtype``: the wire dtype of the parameters to send back after the push (PushPull),
        checked now so a push is never applied and then answered with an error."""
        if pull_dtype is not None:
            self._check_dtype(pull_dtype)
        problem = numbers_problem(metadata, "metadata")
        if problem:
            self._refuse(ErrorKind.BAD_REQUEST, problem)
        problem = non_finite_problem(metadata, "metadata")
        if problem:
            self._refuse(ErrorKind.NON_FINITE, f"{problem}; nothing was applied")
        with self._lock:
            worker = self._worker(worker_id)
            assert self.layout is not None and self.rule is not None
            if worker.observer:
                self._refuse(ErrorKind.BAD_REQUEST, "observers cannot push; join with role ROLE_WORKER", worker)
            if layout_hash != self.layout.hash:
                self._refuse(
                    ErrorKind.LAYOUT_MISMATCH,
                    f"push carries layout {layout_hash[:12] or '(none)'} but this shard holds "
                    f"{self.layout.hash[:12]}; set layout_hash to the one used at Join",
                    worker,
                )
            self._require_initialized()
            try:
                payload = PayloadKind(kind)
            except ValueError:
                self._refuse(ErrorKind.BAD_REQUEST, f"push kind {kind} is unknown; use GRADIENT or DELTA", worker)
            if payload not in self.rule.accepted_kinds:
                accepted = ", ".join(k.name for k in sorted(self.rule.accepted_kinds))
                self._refuse(
                    ErrorKind.BAD_REQUEST,
                    f"rule {self.rule.name} does not take {payload.name} pushes; it takes {accepted} "
                    f"(worker procedure {self.rule.worker_procedure!r})",
                    worker,
                )
            if base_clock > self.clock:
                self._refuse(
                    ErrorKind.FUTURE_CLOCK,
                    f"base_clock {base_clock} is ahead of the shard's clock {self.clock}; "
                    "send the clock of the parameters the update was computed on",
                    worker,
                )
            worker.last_seen = self._now()
            previous = worker.previous_outcome(push_id)
            if self._receive is None or self._receive.length != self.params.numel():
                self._receive = ReceiveBuffers(self.params.numel(), self.config.receive_buffers)
            return PendingPush(
                worker, push_id, base_clock, payload, dict(metadata), previous, buffers=self._receive, cancel=cancel
            )

    def add_chunk(self, pending: PendingPush, chunk: codec.ChunkLike) -> None:
        """Decode one chunk of a push (outside the lock); a replayed push ignores its chunks."""
        pending.bytes_received += len(chunk.data)
        pending.last_chunk_at = self._now()
        if pending.replay is None:
            self.decode_chunk(self._assembler(pending), chunk, pending.worker)

    def _assembler(self, pending: PendingPush) -> codec.Assembler:
        """The push's assembler, over a receive buffer taken now if it has none yet (lock not held)."""
        if pending.assembler is None:
            assert pending.buffers is not None
            # The holder of a GEM reservation never queues behind pushes that wait for it.
            holder = self._reserved_by == pending.worker.worker_id
            try:
                buffer = pending.buffers.acquire(self.config.receive_wait_seconds, bypass_limit=holder)
            except TimeoutError:
                self._refuse(
                    ErrorKind.LIMIT_REACHED,
                    f"no receive buffer came free within {self.config.receive_wait_seconds:.0f} s: "
                    f"{pending.buffers.limit} pushes are being received (--receive-buffers); retry, or raise it",
                    pending.worker,
                )
            pending.assembler = codec.Assembler(buffer)
            pending.last_chunk_at = self._now()
            with self._receiving_lock:
                self._receiving.add(pending)
        return pending.assembler

    def end_of_chunks(self, pending: PendingPush) -> None:
        """The push's stream ended: it no longer waits on its client, so it is never cancelled as stalled.

        Raises PUSH_STALLED if it was cancelled first (its stream may still have ended cleanly,
        when the cancellation raced with the last message): a cancelled push is never applied."""
        stalled = self.stalled(pending)
        if stalled is not None:
            raise stalled

    def stalled(self, pending: PendingPush) -> ShardError | None:
        """The refusal for a push whose stream broke because it was cancelled as stalled, else None."""
        self._stop_watching(pending)
        if not pending.cancelled:
            return None
        message = (
            f"the push held a receive buffer and sent nothing for {self.config.receive_idle_seconds:g} s "
            "(--receive-idle-seconds), so it was cancelled and not applied; retry it"
        )
        return ShardError(ErrorKind.PUSH_STALLED, message, counted=True)

    def _stop_watching(self, pending: PendingPush) -> None:
        with self._receiving_lock:
            self._receiving.discard(pending)

    def cancel_stalled_pushes(self) -> list[PendingPush]:
        """Cancel every push that holds a receive buffer and has sent nothing for ``receive_idle_seconds``.

        Its stream ends with CANCELLED and the handler gives the buffer back; returns them."""
        deadline = self._now() - self.config.receive_idle_seconds
        with self._receiving_lock:
            stalled = [p for p in self._receiving if p.last_chunk_at < deadline]
            self._receiving.difference_update(stalled)
            for pending in stalled:
                pending.cancelled = True
        for pending in stalled:
            _LOGGER.warning(
                "cancelled a push of worker %s (%s): it held a receive buffer and sent nothing for %.0f s",
                pending.worker.worker_id,
                pending.worker.name,
                self.config.receive_idle_seconds,
            )
            self.count_rejected(ErrorKind.PUSH_STALLED.reason, pending.worker)
            if pending.cancel is not None:
                pending.cancel()
        return stalled

    def discard_push(self, pending: PendingPush) -> None:
        """Give back a push's receive buffer; safe to call more than once, and after a commit."""
        self._stop_watching(pending)
        if pending.assembler is not None and pending.buffers is not None:
            pending.buffers.release(pending.assembler.out)
            pending.assembler = None

    def decode_chunk(
        self, assembler: codec.Assembler, chunk: codec.ChunkLike, worker: WorkerRecord | None = None
    ) -> None:
        try:
            assembler.add(chunk)
        except codec.CodecError as error:
            kind = {
                "unknown_dtype": ErrorKind.UNKNOWN_DTYPE,
                "chunk_out_of_range": ErrorKind.CHUNK_OUT_OF_RANGE,
                "bad_chunk_size": ErrorKind.BAD_REQUEST,
            }.get(error.reason, ErrorKind.WRONG_LENGTH)
            self._refuse(kind, str(error), worker)

    def commit_push(self, pending: PendingPush) -> PushOutcome:
        """Apply a validated push with the rule, or replay the outcome of a retried one."""
        with self._lock:
            self.observer.bytes_received(pending.worker, pending.bytes_received)
        if pending.replay is not None:
            return self._replay(pending.worker, pending.replay)
        try:
            assembler = self._assembler(pending)
            self.end_of_chunks(pending)
            return self._commit_decoded(pending, assembler)
        finally:
            self.discard_push(pending)

    def _commit_decoded(self, pending: PendingPush, assembler: codec.Assembler) -> PushOutcome:
        self._check_complete(assembler, pending.worker)
        with self._lock:
            worker = self._worker(pending.worker.worker_id)
            previous = worker.previous_outcome(pending.push_id)
            if previous is not None:
                return self._replay_locked(worker, previous)
            if self.config.consistency.model is ConsistencyModel.BSP:
                # A BSP push is only added to the round (the round's mean is applied once every
                # worker pushed), so it needs no turn: it ends its own GEM reservation now, or
                # the others' reserved pulls would wait for it to lapse every round.
                self._release_reservation(worker)
                return self._commit_bsp(worker, pending)
            self._wait_until(worker, lambda: self._reservation_holder() in (None, worker.worker_id))
            self._release_reservation(worker)
            outcome = self._apply(worker, assembler.out, pending.kind, pending.base_clock, pending.metadata)
            worker.record_push(pending.push_id, outcome)
            self.observer.push_applied(worker, outcome)
            worker.ssp_clock += 1
            self._maybe_capture()
            self._changed.notify_all()
            return outcome

    def _apply(
        self, worker: WorkerRecord, update: torch.Tensor, kind: PayloadKind, base_clock: int, metadata: dict[str, float]
    ) -> PushOutcome:
        assert self.rule is not None
        staleness = self.clock - base_clock
        snapshots = self.snapshots
        ctx = PushContext(
            worker_id=worker.worker_id,
            staleness=staleness,
            kind=kind,
            segments=self._segments,
            metadata=metadata,
            snapshot=lambda: snapshots.get(base_clock),
        )
        self._freeze_pulls()
        started = time.perf_counter()
        telemetry: Telemetry = self.rule.apply(self.params, update, ctx)
        apply_seconds = time.perf_counter() - started
        self.clock += 1
        self.applied_pushes += 1
        outcome = PushOutcome(self.clock, staleness, {"staleness": float(staleness), **telemetry})
        self.observer.update_applied(apply_seconds, self.clock)
        return outcome

    def _maybe_capture(self) -> None:
        """After an update and its push ids are recorded: hand the state to ``on_capture`` when due."""
        if self.capture_every and self.on_capture is not None and self.clock % self.capture_every == 0:
            self.on_capture(self._state_locked())

    def _commit_bsp(self, worker: WorkerRecord, pending: PendingPush) -> PushOutcome:
        """Add this worker's update to the round and wait until the round's mean is applied."""
        assert pending.assembler is not None
        if self._bsp is None:
            self._bsp = BspRound(torch.zeros(self.params.numel()), kind=pending.kind)
        current = self._bsp
        retried = [
            wid
            for wid, pid in current.contributors.items()
            if pid == pending.push_id and current.owners.get(wid) is worker.memory
        ]
        if retried:
            # A retried push (perhaps from the same worker re-joined under a new id) already in this
            # round: wait for the round instead of adding it twice.
            previous_id = retried[0]
            if previous_id != worker.worker_id:
                current.contributors[worker.worker_id] = current.contributors.pop(previous_id)
                current.owners[worker.worker_id] = current.owners.pop(previous_id)
            round_number = current.number
            self.discard_push(pending)
            self._maybe_finish_bsp_round()
            self._wait_until(worker, lambda: self._bsp is None or self._bsp.number != round_number)
            outcome = worker.previous_outcome(pending.push_id)
            assert outcome is not None
            return self._replay_locked(worker, outcome)
        if worker.worker_id in current.contributors:
            self._refuse(
                ErrorKind.BAD_REQUEST,
                f"worker {worker.worker_id} already pushed for BSP clock {self.clock}; wait for the round to finish",
                worker,
            )
        if not current.contributors:
            current.kind = pending.kind  # the first push of a round decides what it collects
        if pending.kind is not current.kind:
            self._refuse(ErrorKind.BAD_REQUEST, f"this BSP round collects {current.kind.name} pushes only", worker)
        current.total.add_(pending.assembler.out)
        # Given back before the barrier: waiting contributors must not hold every buffer.
        self.discard_push(pending)
        current.contributors[worker.worker_id] = pending.push_id
        current.owners[worker.worker_id] = worker.memory
        round_number = current.number
        self._maybe_finish_bsp_round()
        self._wait_until(worker, lambda: self._bsp is None or self._bsp.number != round_number)
        outcome = worker.previous_outcome(pending.push_id)
        assert outcome is not None
        return outcome

    def _maybe_finish_bsp_round(self) -> None:
        current = self._bsp
        if current is None or not bsp_round_complete(current.contributors, [w.worker_id for w in self._live_workers()]):
            return
        contributors = {wid: pid for wid, pid in current.contributors.items() if wid in self.workers}
        if not contributors:
            self._bsp = BspRound(current.total.zero_(), number=current.number + 1)
            return
        current.total.div_(len(current.contributors))
        first = self.workers[next(iter(contributors))]
        outcome = self._apply(first, current.total, current.kind, self.clock, {"workers": float(len(contributors))})
        for worker_id, push_id in current.contributors.items():
            if worker_id not in contributors:
                # Gone since (left, evicted, re-joined): its push id is still remembered as applied.
                owner = current.owners.get(worker_id)
                if owner is not None:
                    owner.record(push_id, outcome)
                continue
            contributor = self.workers[worker_id]
            contributor.record_push(push_id, outcome)
            contributor.ssp_clock += 1
            self.observer.push_applied(contributor, outcome)
        self._bsp = BspRound(current.total.zero_(), number=current.number + 1)
        self._maybe_capture()
        self._changed.notify_all()

    def _replay(self, worker: WorkerRecord, previous: PushOutcome) -> PushOutcome:
        with self._lock:
            return self._replay_locked(worker, previous)

    def _replay_locked(self, worker: WorkerRecord, previous: PushOutcome) -> PushOutcome:
        worker.duplicate_pushes += 1
        self.observer.push_duplicate(worker)
        return PushOutcome(
            clock=previous.clock if previous.clock >= 0 else self.clock,
            staleness=previous.staleness,
            telemetry=previous.telemetry,
            duplicate=True,
        )

    # -- waiting ------------------------------------------------------------------------

    def _wait_for_ssp(self, worker: WorkerRecord) -> None:
        consistency = self.config.consistency
        if consistency.model is not ConsistencyModel.SSP or worker.observer:
            return
        self._wait_until(
            worker,
            lambda: (
                not ssp_must_wait(
                    worker.ssp_clock, (w.ssp_clock for w in self._live_workers()), consistency.staleness_bound
                )
            ),
        )

    def _wait_until(self, worker: WorkerRecord, ready: Callable[[], bool]) -> None:
        """Wait (lock held) until ``ready``; evicts silent workers meanwhile. The waiter stays alive."""
        worker.waiting = True
        try:
            while not ready():
                if worker.worker_id not in self.workers:
                    self._refuse(ErrorKind.UNKNOWN_WORKER, f"worker {worker.worker_id} was evicted while waiting")
                self._changed.wait(WAIT_SLICE_S)
                worker.last_seen = self._now()
                self._evict_expired_locked()
        finally:
            worker.waiting = False

    def _release_reservation(self, worker: WorkerRecord) -> None:
        """End ``worker``'s GEM reservation, if it holds one, and wake the pulls waiting for it (lock held)."""
        if self._reserved_by == worker.worker_id:
            self._reserved_by = None
            self._changed.notify_all()

    def _reservation_holder(self) -> int | None:
        if self._reserved_by is not None and self._now() > self._reserved_until:
            self._reserved_by = None
        return self._reserved_by

    def _live_workers(self) -> list[WorkerRecord]:
        return [w for w in self.workers.values() if not w.observer]

    # -- helpers ----------------------------------------------------------------------

    def _check_complete(self, assembler: codec.Assembler, worker: WorkerRecord | None = None) -> None:
        try:
            assembler.finish()
        except codec.CodecError as error:
            self._refuse(ErrorKind.WRONG_LENGTH, str(error), worker)
        if not assembler.all_finite():
            bad = assembler.count_non_finite()
            self._refuse(ErrorKind.NON_FINITE, f"{bad} element(s) are NaN or Inf; nothing was applied", worker)

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
                f"worker id {worker_id} is not joined to this shard (it never joined, left, was evicted, or "
                "the server restarted); call Join again",
            )
        return worker

    def _refuse(self, kind: ErrorKind, message: str, worker: WorkerRecord | None = None) -> NoReturn:
        self.count_rejected(kind.reason, worker)
        raise ShardError(kind, message, counted=True)

    def count_rejected(self, reason: str, worker: WorkerRecord | None = None) -> None:
        """Count a refused request (Status and metrics), also ones refused before the shard (auth)."""
        with self._rejected_lock:
            self.rejected[reason] = self.rejected.get(reason, 0) + 1
            self.observer.rejected(reason, worker)

    # -- saved state (checkpoints) -----------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """A consistent copy of everything needed to resume: parameters, rule state, clocks,
        workers and their push-id memories. Plain values and tensors only (``torch.load`` with
        ``weights_only=True`` reads it). A BSP round still collecting is not included: its
        pushes were not acknowledged, so their workers retry them."""
        with self._lock:
            return self._state_locked()

    def _state_locked(self) -> dict[str, Any]:
        rule_state = {k: v.detach().clone() for k, v in self.rule.state_tensors().items()} if self.rule else {}
        return {
            "format": STATE_FORMAT,
            "shard_index": self.config.shard_index,
            "num_shards": self.config.num_shards,
            "rule": self.config.rule.rule.name,
            "rule_options": dict(self.config.rule.options.as_strings()),
            "layout": [[name, list(shape)] for name, shape in self.layout.specs] if self.layout else None,
            "initialized": self.initialized,
            "clock": self.clock,
            "applied_pushes": self.applied_pushes,
            "evictions": self.evictions,
            "params": self.params.clone(),
            "rule_state": rule_state,
            "workers": [w.to_state() for w in self.workers.values()],
            "memories": {name: memory.to_state() for name, memory in self._memories.items()},
            "id_counter": next(self._ids),
            "written_at": time.time(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what ``state_dict`` returned, into a shard that has seen no worker yet.

        Raises ``StateError`` (nothing changed) when the state belongs to another rule, shard
        index, shard count or format, or its tensors do not fit its layout."""
        try:
            self._load_state(state)
        except (KeyError, TypeError, ValueError, RuntimeError, LayoutError) as error:
            if isinstance(error, StateError):
                raise
            raise StateError(f"the saved state is incomplete or damaged: {error!r}") from None

    def _load_state(self, state: Mapping[str, Any]) -> None:
        if state.get("format") != STATE_FORMAT:
            raise StateError(f"saved state format {state.get('format')!r}; this server reads format {STATE_FORMAT}")
        ours = (self.config.rule.rule.name, self.config.shard_index, self.config.num_shards)
        theirs = (state["rule"], state["shard_index"], state["num_shards"])
        if ours != theirs:
            raise StateError(
                f"the saved state is of rule {theirs[0]}, shard {theirs[1]} of {theirs[2]}; this server runs rule "
                f"{ours[0]}, shard {ours[1]} of {ours[2]}. Start it with the same --rule, --shard-index and "
                "--num-shards, or use another --checkpoint-dir"
            )
        with self._lock:
            if self.layout is not None or self.workers:
                raise StateError("state can only be restored into a shard no worker has joined yet")
            layout = None
            if state["layout"] is not None:
                layout = Layout.from_named_shapes(
                    ((str(name), tuple(int(d) for d in shape)) for name, shape in state["layout"]),
                    self.config.num_shards,
                )
            params: torch.Tensor = state["params"]
            if layout is not None:
                expected = layout.shard(self.config.shard_index).length
                if params.shape != (expected,) or params.dtype != torch.float32:
                    raise StateError(f"saved parameters {tuple(params.shape)} do not fit the layout ({expected},)")
                try:
                    self._adopt_layout(layout)
                except ShardError as error:
                    raise StateError(error.message) from None
                assert self.rule is not None
                try:
                    self.rule.load_state_tensors(state["rule_state"])
                except ValueError as error:
                    self.layout, self.rule, self.params = None, None, torch.empty(0)
                    raise StateError(
                        f"the saved state of rule {state['rule']} does not fit: {error} "
                        "(was it saved with other rule options?)"
                    ) from None
                self.params.copy_(params)
            now = self._now()
            memories = {str(name): PushMemory.from_state(m) for name, m in state["memories"].items()}
            workers = {}
            for saved_worker in state["workers"]:
                name = str(saved_worker["name"])
                memory = memories.setdefault(name, PushMemory())
                record = WorkerRecord.from_state(saved_worker, memory, now)
                workers[record.worker_id] = record
            self._memories = memories
            self.workers = workers
            self.initialized = bool(state["initialized"]) and layout is not None
            self.clock = int(state["clock"])
            self.applied_pushes = int(state["applied_pushes"])
            self.evictions = int(state["evictions"])
            self._ids = itertools.count(max(int(state["id_counter"]), max(workers, default=0) + 1))
            self._pull_cache = {}
            for record in workers.values():
                self.observer.worker_joined(record)

    def uptime_seconds(self) -> float:
        return self._now() - self.started

    def worker_snapshot(self) -> list[WorkerRecord]:
        with self._lock:
            return list(self.workers.values())
