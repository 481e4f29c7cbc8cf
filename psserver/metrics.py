"""Prometheus metrics of one shard: a ``ShardObserver`` that records them, and their HTTP endpoint.

Every metric lives in the shard's own ``CollectorRegistry`` and carries a ``shard`` label;
per-worker series also carry ``worker`` (the worker's name, unique among running workers).
A worker's series are removed when it leaves or is evicted, so the label set stays bounded
by the workers alive now. Observer-role clients only pull: they get pull and byte series,
never push series.

The shard calls the observer methods with its lock held; each one is a dictionary lookup
and a few counter increments. docs/observability.md lists every metric.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
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
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from psserver.core.workers import PushOutcome, WorkerRecord

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

_MetricT = TypeVar("_MetricT", bound=MetricWrapperBase)


@dataclass
class _WorkerSeries:
    """Who holds one worker label now, and what must be removed when the last of them goes."""

    labels: tuple[str, str]
    worker_ids: set[int] = field(default_factory=set)
    # `reason` values this name has series for in hetps_worker_rejected_requests_total.
    rejected_reasons: set[str] = field(default_factory=set)
    # Each per-worker metric's series for this name, looked up once: ``labels`` validates and
    # takes the metric's lock on every call, and a push records up to six. They go with this
    # record when the name's last holder leaves, so a removed series is never written again.
    _children: dict[MetricWrapperBase, MetricWrapperBase] = field(default_factory=dict)

    def child(self, metric: _MetricT) -> _MetricT:
        found = self._children.get(metric)
        if found is None:
            found = self._children[metric] = metric.labels(*self.labels)
        return found  # type: ignore[return-value]


class ShardMetrics:
    """Records what a shard reports as Prometheus metrics; pass it as the shard's observer.

    Every hook but ``rejected`` runs under the shard lock, so no worker leaves in the middle
    of one; ``rejected`` (and join/leave bookkeeping) also take this object's own lock.
    """

    def __init__(
        self,
        shard_index: int = 0,
        info: Mapping[str, str] | None = None,
        registry: CollectorRegistry | None = None,
        wall_clock: Callable[[], float] = time.time,
        process_metrics: bool = False,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.shard = str(shard_index)
        self._now = wall_clock
        self._lock = threading.Lock()
        self._series: dict[str, _WorkerSeries] = {}
        self._checkpoint_timestamp: float | None = None
        r = self.registry

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

        # The shard's own series, made now (so they start from zero) and kept: never removed.
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

    # -- ShardObserver ------------------------------------------------------------------

    def worker_joined(self, worker: WorkerRecord) -> None:
        with self._lock:
            series = self._series.get(worker.name)
            if series is None:
                series = self._series[worker.name] = _WorkerSeries((self.shard, worker.name))
            series.worker_ids.add(worker.worker_id)
        self._joins.inc()
        self.active_workers.labels(self.shard, _role(worker)).inc()
        # Create the series now so that rate() sees them start from zero.
        series.child(self.pulls)
        series.child(self.sent_bytes)
        if not worker.observer:
            series.child(self.pushes)
            series.child(self.duplicate_pushes)
            series.child(self.received_bytes)
            series.child(self.staleness)

    def worker_left(self, worker: WorkerRecord, evicted: bool) -> None:
        self.active_workers.labels(self.shard, _role(worker)).dec()
        if evicted:
            self._evictions.inc()
        with self._lock:
            series = self._series.get(worker.name)
            if series is None:
                return
            series.worker_ids.discard(worker.worker_id)
            if series.worker_ids:
                return  # another running worker holds the same name
            del self._series[worker.name]
            labels = (self.shard, worker.name)
            for metric in self._per_worker_metrics():
                metric.remove(*labels)
            for reason in series.rejected_reasons:
                self.worker_rejected.remove(*labels, reason)

    def update_applied(self, apply_seconds: float, clock: int) -> None:
        self._clock.set(clock)
        self._updates.inc()
        self._apply_seconds.observe(apply_seconds)

    def update_committed(self, clock: int, capture_state: Callable[[], dict[str, Any]]) -> None:
        pass

    def push_applied(self, worker: WorkerRecord, outcome: PushOutcome) -> None:
        series = self._live_series(worker)
        if series is None:
            return
        series.child(self.pushes).inc()
        series.child(self.staleness).observe(outcome.staleness)
        gap = outcome.telemetry.get("gap")
        if gap is not None and math.isfinite(gap):
            series.child(self.gap).observe(gap)
        scale = outcome.telemetry.get("scale")
        if scale is not None and math.isfinite(scale):
            series.child(self.scale).observe(scale)
        if outcome.local_steps > 0:
            series.child(self.local_steps).set(outcome.local_steps)
        if outcome.telemetry.get("momentum_step") == 1.0:
            self._momentum_steps.inc()

    def push_duplicate(self, worker: WorkerRecord) -> None:
        series = self._live_series(worker)
        if series is not None:
            series.child(self.duplicate_pushes).inc()

    def bytes_received(self, worker: WorkerRecord, count: int) -> None:
        series = self._live_series(worker)
        if series is not None:
            series.child(self.received_bytes).inc(count)

    def pulled(self, worker: WorkerRecord, clock: int, bytes_sent: int) -> None:
        series = self._live_series(worker)
        if series is not None:
            series.child(self.pulls).inc()
            series.child(self.sent_bytes).inc(bytes_sent)

    def rejected(self, reason: str, worker: WorkerRecord | None) -> None:
        self.rejected_requests.labels(self.shard, reason).inc()
        if worker is None:
            return
        with self._lock:
            series = self._series.get(worker.name)
            if series is None or worker.worker_id not in series.worker_ids:
                return
            series.rejected_reasons.add(reason)
            # Counted under the lock so that a concurrent leave cannot remove the series first.
            self.worker_rejected.labels(self.shard, worker.name, reason).inc()

    def heartbeat(self, worker: WorkerRecord, stats: Mapping[str, float]) -> None:
        series = None if worker.observer else self._live_series(worker)
        if series is None:
            return
        if "compute_seconds" in stats:
            series.child(self.compute_seconds).set(stats["compute_seconds"])
        if "samples_per_second" in stats:
            series.child(self.samples_per_second).set(stats["samples_per_second"])

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
        self._clock.set(clock)

    def worker_names(self) -> set[str]:
        """Names that have per-worker series now."""
        with self._lock:
            return set(self._series)

    # -- internals ------------------------------------------------------------------------

    def _live_series(self, worker: WorkerRecord) -> _WorkerSeries | None:
        """None for a worker that already left: its series were removed and must not come back."""
        series = self._series.get(worker.name)
        return series if series is not None and worker.worker_id in series.worker_ids else None

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
            self.compute_seconds,
            self.samples_per_second,
            self.local_steps,
        )


def _role(worker: WorkerRecord) -> str:
    return "observer" if worker.observer else "worker"


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
