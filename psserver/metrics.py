"""Prometheus metrics of one shard: a ``ShardMetrics`` observer that records them, and their HTTP endpoint.

Every metric lives in the shard's own ``CollectorRegistry`` and carries a ``shard`` label;
per-worker series also carry ``worker``. A scrape stays small however many workers join: at
most ``worker_series`` joined clients have series of their own, chosen as the ones an operator
needs to see (refused, furthest behind, slowest: ``ShardMetrics._select``); everyone else's
events are counted in one aggregate series per metric whose ``worker`` label is empty
(Prometheus stores it without the label), so a sum of rates over a metric's series still counts
every worker. The choice is revised at a scrape, at most every ``SELECTION_SECONDS``, and a
place changes hands only to a client that clearly needs it more, so labels do not churn. A
worker's series are removed when it leaves, is evicted or gives its place up. Observer-role clients
only pull: they get pull and byte series, never push series.

The shard calls the observer methods with its lock held; each takes this object's lock, looks
up one dictionary entry and increments a few counters. A replica of a replicated shard adds its
standing (``watch_replica``), read from the replica at each scrape. docs/observability.md lists
every metric.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    GC_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from psserver.core.workers import PushOutcome, WorkerRecord

if TYPE_CHECKING:  # the replication package brings etcd's client, which a lone server never needs
    from psserver.replication.node import ReplicaView

# `psserver serve` listens for scrapes on DEFAULT_METRICS_PORT + shard index unless told otherwise.
DEFAULT_METRICS_PORT = 9400

# Staleness τ counts updates applied between a worker's pull and its push.
STALENESS_BUCKETS = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)
# GA's mean gap |θ − θ_b| / C: 0 when nothing moved, around 1 when the model moved one typical step.
# DC-ASGD reports an un-normalised mean |θ − θ_bak| instead, which mostly falls in the lowest buckets.
GAP_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
# The factor a rule applied to a push: 1 is the plain step; penalties lie below, AB's boost above.
SCALE_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 1.0, 1.25, 1.5, 2.0)
APPLY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
RPC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

_WORKER = ("shard", "worker")

# Joined clients that have series of their own, unless ``metrics.worker_series`` says otherwise;
# the rest are counted in the aggregate series. 32 workers keep a scrape near 150 kB.
DEFAULT_WORKER_SERIES = 32
# Who has series of their own is revised at a scrape at most this often: long enough that a
# worker's series outlive a few scrapes (rate() needs two), short enough to follow a straggler.
SELECTION_SECONDS = 30.0
# A client without series takes the place of one with series only when it needs them this many
# times more (``ShardMetrics._select``), so that workers alike keep their places.
_SWAP_MARGIN = 1.25
# The weight of a push's staleness in a client's smoothed staleness: the last few pushes count,
# whenever they came, so a worker slower than SELECTION_SECONDS is judged as well as a fast one.
_SMOOTHING = 0.25
# The ``worker`` label value of the aggregate series. The protocol refuses an empty worker name,
# so no worker's own series can take it; Prometheus stores the series without a ``worker`` label.
AGGREGATE_WORKER = ""

_MetricT = TypeVar("_MetricT", bound=MetricWrapperBase)


@dataclass
class _Series:
    """One ``worker`` label value's series (a client's own, or the aggregate) and what removing them takes."""

    labels: tuple[str, str]
    # `reason` values these labels have series for in hetps_worker_rejected_requests_total.
    rejected_reasons: set[str] = field(default_factory=set)
    # Each per-worker metric's series for these labels, looked up once: ``labels`` validates and
    # takes the metric's lock on every call, and a push records up to six. They go with this
    # record when the series are removed, so a removed series is never written again.
    _children: dict[MetricWrapperBase, MetricWrapperBase] = field(default_factory=dict)

    def child(self, metric: _MetricT) -> _MetricT:
        found = self._children.get(metric)
        if found is None:
            found = self._children[metric] = metric.labels(*self.labels)
        return found  # type: ignore[return-value]

    def drop(self, metric: MetricWrapperBase) -> None:
        """Remove this label value's series of ``metric`` (a gauge with nothing to show)."""
        metric.remove(*self.labels)
        self._children.pop(metric, None)


@dataclass(eq=False)  # one per name, compared by identity (a key while choosing)
class _Client:
    """One worker name among the joined clients: its series, if it has its own, and how much it matters."""

    name: str
    observer: bool
    worker_ids: set[int] = field(default_factory=set)
    # None: its events are counted in the aggregate series.
    series: _Series | None = None
    # The staleness of its pushes, smoothed over the last few (``_SMOOTHING``); None before its first.
    staleness: float | None = None
    # Requests refused since the last revision of who has series.
    refused: int = 0
    # The clock of the parameters it holds (its last pull, or the clock when it joined).
    pulled_clock: int = 0
    # Its gauges' latest values, kept while it has no series (averaged into the aggregate's) so
    # that series given to it later start from them.
    gauges: dict[str, float] = field(default_factory=dict)

    def behind(self, clock: int) -> float:
        """Updates it is behind: its pushes' smoothed staleness, or half the age of the parameters it
        holds when that is larger. Between two pushes the age runs from 0 to about the staleness, so
        at half it changes nothing for a worker keeping its pace; a stalled worker pushes nothing,
        and its parameters' age overtakes once it has been silent about twice its usual interval."""
        if self.observer:
            return 0.0  # it never pushes: its parameters' age is its own business
        return max(self.staleness or 0.0, (clock - self.pulled_clock) / 2)

    def pushed(self, staleness: int) -> None:
        if self.staleness is None:
            self.staleness = float(staleness)
        else:
            self.staleness += _SMOOTHING * (staleness - self.staleness)

    def need(self, clock: int, fastest: float) -> float:
        """How much an operator needs to see this client: how far behind it is (stragglers under async
        and SSP), times how much slower it computes than the fastest that reported a speed (under BSP
        everyone is equally behind, and the slowest holds the barrier)."""
        speed = self.gauges.get("samples_per_second")
        slowness = fastest / speed if speed is not None and speed > 0 and fastest > 0 else 1.0
        return (self.behind(clock) + 1.0) * slowness


class ShardMetrics:
    """Records what a shard reports as Prometheus metrics; pass it as the shard's observer.

    Every hook takes this object's lock (the shard's hooks also hold the shard lock); a scrape
    takes it to revise who has series of their own, so no event ever writes to a removed series.
    """

    def __init__(
        self,
        shard_index: int = 0,
        info: Mapping[str, str] | None = None,
        registry: CollectorRegistry | None = None,
        wall_clock: Callable[[], float] = time.time,
        process_metrics: bool = False,
        worker_series: int = DEFAULT_WORKER_SERIES,
    ) -> None:
        if worker_series < 0:
            raise ValueError(f"worker_series must be 0 or more, not {worker_series}")
        self.registry = registry if registry is not None else CollectorRegistry()
        self.shard = str(shard_index)
        self.worker_series = worker_series
        self._now = wall_clock
        self._lock = threading.Lock()
        self._clients: dict[str, _Client] = {}
        self._with_series = 0
        self._aggregate: _Series | None = None
        self._clock_value = 0
        self._next_selection = wall_clock() + SELECTION_SECONDS
        self._checkpoint_timestamp: float | None = None
        r = self.registry
        # First in the registry, so that a scrape revises who has series before it reads them.
        r.register(_BeforeScrape(self))

        # Per worker.
        self.staleness = Histogram(
            "hetps_push_staleness",
            "Staleness τ of each applied push: updates applied between the worker's pull and its push",
            _WORKER,
            buckets=STALENESS_BUCKETS,
            registry=r,
        )
        self.gap = Histogram(
            "hetps_push_gap",
            "Mean gap between the parameters a push was computed on and those it was applied to: "
            "|θ − θ_pulled| / C (the step scale) under gap-aware rules; un-normalised mean |θ − θ_pulled| under "
            "DC-ASGD",
            _WORKER,
            buckets=GAP_BUCKETS,
            registry=r,
        )
        self.scale = Histogram(
            "hetps_push_scale",
            "Scale (penalty) the update rule applied to each push; 1 is an unscaled step",
            _WORKER,
            buckets=SCALE_BUCKETS,
            registry=r,
        )
        self.pushes = Counter("hetps_pushes_total", "Pushes applied", _WORKER, registry=r)
        self.duplicate_pushes = Counter(
            "hetps_duplicate_pushes_total",
            "Retried pushes acknowledged again without being applied",
            _WORKER,
            registry=r,
        )
        self.pulls = Counter("hetps_pulls_total", "Parameter pulls served", _WORKER, registry=r)
        self.received_bytes = Counter(
            "hetps_received_bytes_total", "Update payload bytes received in pushes", _WORKER, registry=r
        )
        self.sent_bytes = Counter(
            "hetps_sent_bytes_total", "Parameter payload bytes sent in pulls", _WORKER, registry=r
        )
        self.worker_rejected = Counter(
            "hetps_worker_rejected_requests_total",
            "Requests of a joined worker refused, by reason",
            (*_WORKER, "reason"),
            registry=r,
        )
        self.compute_seconds = Gauge(
            "hetps_worker_compute_seconds",
            "The worker's own compute time per step (forward and backward), from its heartbeats",
            _WORKER,
            registry=r,
        )
        self.samples_per_second = Gauge(
            "hetps_worker_samples_per_second",
            "Training samples the worker processes per second of compute, from its heartbeats",
            _WORKER,
            registry=r,
        )
        self.local_steps = Gauge(
            "hetps_worker_local_steps",
            "Local steps the rule assigned to the worker's next window, from its measured speed",
            _WORKER,
            registry=r,
        )

        # Per shard.
        self.clock = Gauge("hetps_clock", "The shard's clock: updates applied to its parameters", ["shard"], registry=r)
        self.updates = Counter(
            "hetps_updates_applied_total", "Updates applied since this process started", ["shard"], registry=r
        )
        self.active_workers = Gauge(
            "hetps_active_workers", "Joined clients, by role (worker or observer)", ["shard", "role"], registry=r
        )
        self.aggregated_workers = Gauge(
            "hetps_aggregated_workers",
            "Joined clients without series of their own, counted in the per-worker metrics' aggregate series "
            "(worker label empty), by role",
            ["shard", "role"],
            registry=r,
        )
        self.joins = Counter("hetps_worker_joins_total", "Joins accepted", ["shard"], registry=r)
        self.evictions = Counter(
            "hetps_evictions_total", "Workers evicted because their lease expired", ["shard"], registry=r
        )
        self.rejected_requests = Counter(
            "hetps_rejected_requests_total", "Requests refused, by reason", ["shard", "reason"], registry=r
        )
        self.snapshots_dropped = Counter(
            "hetps_snapshots_dropped_total",
            "Parameter versions (snapshots) dropped to stay under shard.snapshot_memory_bytes; a push computed on one "
            "is applied with a gap of zero (snapshot_missing)",
            ["shard"],
            registry=r,
        )
        self.momentum_steps = Counter(
            "hetps_momentum_steps_total",
            "Pushes that closed a Delayed Nesterov period and updated the outer momentum (diloco-dn)",
            ["shard"],
            registry=r,
        )
        self.pull_hold_seconds = Histogram(
            "hetps_pull_hold_seconds",
            "Time a pull waited on a hold its rule put on it (until the pushes landing with its own are applied)",
            ["shard"],
            buckets=RPC_BUCKETS,
            registry=r,
        )
        self.apply_seconds = Histogram(
            "hetps_apply_duration_seconds",
            "Time the update rule took to apply one update to the shard",
            ["shard"],
            buckets=APPLY_BUCKETS,
            registry=r,
        )
        self.rpc_seconds = Histogram(
            "hetps_rpc_duration_seconds",
            "Time from an RPC's arrival to its last response message, by service, method and status code",
            ["shard", "service", "method", "code"],
            buckets=RPC_BUCKETS,
            registry=r,
        )
        shard_info = Info("hetps_shard", "What this shard serves", ["shard"], registry=r)
        shard_info.labels(self.shard).info(dict(info or {}))
        r.register(_CheckpointCollector(self))
        if process_metrics:
            ProcessCollector(registry=r)
            PlatformCollector(registry=r)
            r.register(GC_COLLECTOR)

        self._start_shard_series()

    def _start_shard_series(self) -> None:
        """The shard's own series, made now (so they start from zero) and kept: never removed."""
        self._clock = self.clock.labels(self.shard)
        self._clock.set(0)
        self._updates = self.updates.labels(self.shard)
        self._joins = self.joins.labels(self.shard)
        self._evictions = self.evictions.labels(self.shard)
        self._snapshots_dropped = self.snapshots_dropped.labels(self.shard)
        self._momentum_steps = self.momentum_steps.labels(self.shard)
        self._apply_seconds = self.apply_seconds.labels(self.shard)
        self._pull_hold_seconds = self.pull_hold_seconds.labels(self.shard)
        self._rpc_children: dict[tuple[str, str, str], Histogram] = {}
        for role in ("worker", "observer"):
            self.active_workers.labels(self.shard, role).set(0)
            self.aggregated_workers.labels(self.shard, role).set(0)

    # -- ShardObserver ------------------------------------------------------------------

    def worker_joined(self, worker: WorkerRecord) -> None:
        self._joins.inc()
        self.active_workers.labels(self.shard, _role(worker)).inc()
        with self._lock:
            client = self._clients.get(worker.name)
            if client is None:
                client = self._clients[worker.name] = _Client(worker.name, worker.observer)
                client.pulled_clock = self._clock_value
                if self._with_series < self.worker_series and worker.name != AGGREGATE_WORKER:
                    self._give_series(client)
                else:
                    self._aggregate_series()
                    self.aggregated_workers.labels(self.shard, _role(client)).inc()
            client.worker_ids.add(worker.worker_id)

    def worker_left(self, worker: WorkerRecord, evicted: bool) -> None:
        self.active_workers.labels(self.shard, _role(worker)).dec()
        if evicted:
            self._evictions.inc()
        with self._lock:
            client = self._live(worker)
            if client is None:
                return
            client.worker_ids.discard(worker.worker_id)
            if client.worker_ids:
                return  # another running worker holds the same name
            del self._clients[worker.name]
            if client.series is not None:
                self._remove_series(client)
            else:
                self.aggregated_workers.labels(self.shard, _role(worker)).dec()

    def update_applied(self, apply_seconds: float, clock: int) -> None:
        self._clock_value = clock
        self._clock.set(clock)
        self._updates.inc()
        self._apply_seconds.observe(apply_seconds)

    def update_committed(self, clock: int, capture_state: Callable[[], dict[str, Any]]) -> None:
        pass

    def push_applied(self, worker: WorkerRecord, outcome: PushOutcome) -> None:
        if outcome.telemetry.get("momentum_step") == 1.0:
            self._momentum_steps.inc()
        with self._lock:
            client = self._live(worker)
            if client is None:
                return
            client.pushed(outcome.staleness)
            series = self._series_of(client)
            series.child(self.pushes).inc()
            series.child(self.staleness).observe(outcome.staleness)
            gap = outcome.telemetry.get("gap")
            if gap is not None and math.isfinite(gap):
                series.child(self.gap).observe(gap)
            scale = outcome.telemetry.get("scale")
            if scale is not None and math.isfinite(scale):
                series.child(self.scale).observe(scale)
            if outcome.local_steps > 0:
                self._set_gauge(client, "local_steps", outcome.local_steps)

    def push_duplicate(self, worker: WorkerRecord) -> None:
        with self._lock:
            client = self._live(worker)
            if client is not None:
                self._series_of(client).child(self.duplicate_pushes).inc()

    def bytes_received(self, worker: WorkerRecord, count: int) -> None:
        with self._lock:
            client = self._live(worker)
            if client is not None:
                self._series_of(client).child(self.received_bytes).inc(count)

    def pulled(self, worker: WorkerRecord, clock: int, bytes_sent: int) -> None:
        with self._lock:
            client = self._live(worker)
            if client is None:
                return
            client.pulled_clock = clock
            series = self._series_of(client)
            series.child(self.pulls).inc()
            series.child(self.sent_bytes).inc(bytes_sent)

    def rejected(self, reason: str, worker: WorkerRecord | None) -> None:
        self.rejected_requests.labels(self.shard, reason).inc()
        if worker is None:
            return
        with self._lock:
            client = self._live(worker)
            if client is None:
                return
            client.refused += 1
            series = self._series_of(client)
            series.rejected_reasons.add(reason)
            self.worker_rejected.labels(*series.labels, reason).inc()

    def heartbeat(self, worker: WorkerRecord, stats: Mapping[str, float]) -> None:
        if worker.observer:
            return
        with self._lock:
            client = self._live(worker)
            if client is None:
                return
            for key in ("compute_seconds", "samples_per_second"):
                if key in stats:
                    self._set_gauge(client, key, stats[key])

    def snapshot_dropped(self, clock: int) -> None:
        self._snapshots_dropped.inc()

    def pull_held(self, worker: WorkerRecord, seconds: float) -> None:
        self._pull_hold_seconds.observe(seconds)

    # -- beyond the shard's observer hooks -------------------------------------------------

    def rpc_finished(self, service: str, method: str, code: str, seconds: float) -> None:
        """Record one RPC's latency (called by psserver.rpc.latency's interceptor)."""
        key = (service, method, code)
        child = self._rpc_children.get(key)
        if child is None:
            # Never removed, and bounded: the interceptor records only registered methods.
            child = self._rpc_children[key] = self.rpc_seconds.labels(self.shard, *key)
        child.observe(seconds)

    def checkpoint_written(self, timestamp: float | None = None) -> None:
        """A checkpoint is on disk: written now, or (on restore) written at Unix time ``timestamp``."""
        self._checkpoint_timestamp = self._now() if timestamp is None else timestamp

    def clock_restored(self, clock: int) -> None:
        """The shard's clock was restored from a checkpoint (pushes move it from then on)."""
        self._clock_value = clock
        self._clock.set(clock)

    def watch_replica(self, view: Callable[[], ReplicaView]) -> None:
        """Export this replica's standing, and on the primary its backups', as ``view`` returns it
        at each scrape (a lone server never calls this, and exports none of it)."""
        self.registry.register(_ReplicaCollector(self.shard, view))

    def worker_names(self) -> set[str]:
        """Names that have series of their own now."""
        with self._lock:
            return {name for name, client in self._clients.items() if client.series is not None}

    # -- who has series of their own --------------------------------------------------------

    def before_scrape(self) -> None:
        """Revise who has series of their own when ``SELECTION_SECONDS`` have passed, and set the
        aggregate's gauges to the mean over the clients counted in it."""
        with self._lock:
            now = self._now()
            if now >= self._next_selection:
                self._next_selection = now + SELECTION_SECONDS
                self._select()
            if self._aggregate is not None:
                self._set_aggregate_gauges(self._aggregate)

    def _set_aggregate_gauges(self, aggregate: _Series) -> None:
        """Each gauge of the aggregate: the mean over the clients counted in it that reported one."""
        for key, metric in self._gauges():
            values = [c.gauges[key] for c in self._clients.values() if c.series is None and key in c.gauges]
            if values:
                aggregate.child(metric).set(sum(values) / len(values))
            else:
                aggregate.drop(metric)

    def _select(self) -> None:
        """Free places go to the clients that matter most; then, while the one that matters most
        without series clearly matters more than the one that matters least with them, they trade.

        What matters: refused requests since the last revision first (a client bug or a
        misconfiguration), then ``_Client.need``. Clearly: more refusals, or as many and
        ``_SWAP_MARGIN`` times the need, so workers alike keep their places instead of trading
        them at every revision. Refusals are counted afresh from here."""
        clock = self._clock_value
        fastest = max((c.gauges.get("samples_per_second", 0.0) for c in self._clients.values()), default=0.0)
        order = {
            client: (client.refused, client.need(clock, fastest), client.name)
            for client in self._clients.values()
            if client.name != AGGREGATE_WORKER
        }
        ranked = sorted(order, key=order.__getitem__, reverse=True)
        holders = [c for c in ranked if c.series is not None]
        challengers = [c for c in ranked if c.series is None]
        free = self.worker_series - len(holders)
        taking, challengers = challengers[:free], challengers[free:]
        for challenger, holder in zip(challengers, reversed(holders), strict=False):
            (refused, need, _), (holder_refused, holder_need, _) = order[challenger], order[holder]
            if refused < holder_refused or (refused == holder_refused and need <= _SWAP_MARGIN * holder_need):
                break
            self._remove_series(holder)
            self.aggregated_workers.labels(self.shard, _role(holder)).inc()
            taking.append(challenger)
        for client in taking:
            self._give_series(client)
            self.aggregated_workers.labels(self.shard, _role(client)).dec()
        for client in ranked:
            client.refused = 0

    def _give_series(self, client: _Client) -> None:
        """Its own series, made now so that rate() sees them start from zero, and its gauges as last reported."""
        series = client.series = _Series((self.shard, client.name))
        self._with_series += 1
        self._start_series(series, client.observer)
        for key, metric in self._gauges():
            if key in client.gauges:
                series.child(metric).set(client.gauges[key])

    def _remove_series(self, client: _Client) -> None:
        series = client.series
        assert series is not None
        client.series = None
        self._with_series -= 1
        for metric in self._per_worker_metrics():
            metric.remove(*series.labels)
        for reason in series.rejected_reasons:
            self.worker_rejected.remove(*series.labels, reason)

    def _aggregate_series(self) -> _Series:
        """The aggregate series, made when the first client is counted in them and kept from then on
        (their counters only grow: rate() over them never sees a reset)."""
        if self._aggregate is None:
            self._aggregate = _Series((self.shard, AGGREGATE_WORKER))
            self._start_series(self._aggregate, observer=False)
        return self._aggregate

    def _start_series(self, series: _Series, observer: bool) -> None:
        series.child(self.pulls)
        series.child(self.sent_bytes)
        if not observer:
            series.child(self.pushes)
            series.child(self.duplicate_pushes)
            series.child(self.received_bytes)
            series.child(self.staleness)

    def _series_of(self, client: _Client) -> _Series:
        return client.series if client.series is not None else self._aggregate_series()

    def _set_gauge(self, client: _Client, key: str, value: float) -> None:
        client.gauges[key] = value
        if client.series is not None:
            client.series.child(dict(self._gauges())[key]).set(value)

    # -- internals ------------------------------------------------------------------------

    def _live(self, worker: WorkerRecord) -> _Client | None:
        """None for a worker that already left: its series were removed and must not come back."""
        client = self._clients.get(worker.name)
        return client if client is not None and worker.worker_id in client.worker_ids else None

    def _gauges(self) -> tuple[tuple[str, Gauge], ...]:
        """Each per-worker gauge with its key in ``_Client.gauges`` (a heartbeat's stats use the same keys)."""
        return (
            ("compute_seconds", self.compute_seconds),
            ("samples_per_second", self.samples_per_second),
            ("local_steps", self.local_steps),
        )

    def _per_worker_metrics(self) -> Iterable[Counter | Gauge | Histogram]:
        return (
            self.staleness,
            self.gap,
            self.scale,
            self.pushes,
            self.duplicate_pushes,
            self.pulls,
            self.received_bytes,
            self.sent_bytes,
            *(metric for _, metric in self._gauges()),
        )


def _role(client: WorkerRecord | _Client) -> str:
    return "observer" if client.observer else "worker"


class _BeforeScrape(Collector):
    """Registered first, so that a scrape revises who has series of their own before it reads any."""

    def __init__(self, metrics: ShardMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        self._metrics.before_scrape()
        return []

    def describe(self) -> Iterable[Metric]:
        return []


class _CheckpointCollector(Collector):
    """Checkpoint time and age, present only once a checkpoint exists."""

    def __init__(self, metrics: ShardMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        written = self._metrics._checkpoint_timestamp
        if written is None:
            return []
        shard = self._metrics.shard
        last = GaugeMetricFamily(
            "hetps_checkpoint_last_timestamp_seconds",
            "Unix time the latest checkpoint was written",
            labels=["shard"],
        )
        last.add_metric([shard], written)
        age = GaugeMetricFamily(
            "hetps_checkpoint_age_seconds", "Seconds since the latest checkpoint was written", labels=["shard"]
        )
        age.add_metric([shard], max(0.0, self._metrics._now() - written))
        return [last, age]

    def describe(self) -> Iterable[Metric]:
        return []


class _ReplicaCollector(Collector):
    """A replica's standing and its backups' lag, read from the replica when scraped: nothing polls."""

    def __init__(self, shard: str, view: Callable[[], ReplicaView]) -> None:
        self._shard = shard
        self._view = view

    def collect(self) -> Iterable[Metric]:
        view = self._view()
        if not view.name:
            return []  # not registered in etcd yet: it has no name to be labelled by
        labels = [self._shard, view.name]

        def gauge(name: str, text: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, text, labels=["shard", "replica"])
            family.add_metric(labels, value)
            return family

        def counter(name: str, text: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, text, labels=["shard", "replica"])
            family.add_metric(labels, value)
            return family

        # A series per role, 1 for the one it holds: a change of role changes values, not series.
        role = GaugeMetricFamily(
            "hetps_replica_role",
            "1 for the role this replica holds (candidate, backup, primary, deposed), 0 for the others",
            labels=["shard", "replica", "role"],
        )
        for each in type(view.role):
            role.add_metric([*labels, each.value], float(view.role is each))
        families: list[Metric] = [
            role,
            gauge("hetps_replica_epoch", "The newest primary's epoch this replica knows", view.epoch),
            gauge(
                "hetps_replica_in_sync",
                "1 while this replica holds every acknowledged change (named in etcd's in-sync set)",
                float(view.in_sync),
            ),
            gauge(
                "hetps_replica_version",
                "Primary: its state's version (one more at every change); backup: the version it holds",
                view.version,
            ),
            counter(
                "hetps_replica_failovers",
                "Times this process became primary in place of another (promotions past epoch 1)",
                view.failovers,
            ),
            counter(
                "hetps_replica_digest_mismatches",
                "States whose digest a backup found different from the primary's (each one logged)",
                view.digest_mismatches,
            ),
        ]
        if view.backups:
            backup = ("shard", "backup")
            in_sync = GaugeMetricFamily(
                "hetps_backup_in_sync", "On the primary: 1 while the backup is in the in-sync set", labels=backup
            )
            versions = GaugeMetricFamily(
                "hetps_backup_lag_versions", "On the primary: changes the backup has not acknowledged", labels=backup
            )
            sizes = GaugeMetricFamily(
                "hetps_backup_lag_bytes",
                "On the primary: bytes of the newest state while the backup has not acknowledged it",
                labels=backup,
            )
            seconds = GaugeMetricFamily(
                "hetps_backup_lag_seconds",
                "On the primary: seconds since the oldest change the backup has not acknowledged",
                labels=backup,
            )
            for b in view.backups:
                where = [self._shard, b.name]
                in_sync.add_metric(where, float(b.in_sync))
                versions.add_metric(where, b.lag_versions)
                sizes.add_metric(where, b.lag_bytes)
                seconds.add_metric(where, b.lag_seconds)
            families += [in_sync, versions, sizes, seconds]
        return families

    def describe(self) -> Iterable[Metric]:
        return []


@dataclass
class MetricsServer:
    """A running scrape endpoint; ``close`` stops it."""

    httpd: WSGIServer
    thread: threading.Thread

    @property
    def port(self) -> int:
        return int(self.httpd.server_port)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5.0)


def serve_metrics(registry: CollectorRegistry, host: str, port: int) -> MetricsServer:
    """Serve ``registry`` at ``http://host:port/metrics`` from a daemon thread; port 0 picks a free one.

    Raises ``OSError`` when the port cannot be bound.
    """
    # A process serving one shard's metrics has no use for the `_created` series beside every counter.
    disable_created_metrics()  # type: ignore[no-untyped-call]
    httpd, thread = start_http_server(port, host, registry)
    return MetricsServer(httpd, thread)
