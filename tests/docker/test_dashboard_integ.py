"""The Grafana dashboard's queries and the example Prometheus config, checked by Prometheus's own promtool; the
dashboard read by a real Prometheus at 512 workers."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from psserver.core.workers import PushOutcome, WorkerRecord
from psserver.metrics import ShardMetrics, serve_metrics
from tests.docker.test_dashboard import DOCKER, as_promql, load_dashboard, queries
from tests.integration.probes import wait_for
from tests.integration.test_prometheus_integ import needs_prometheus, prometheus, query
from tests.psserver.test_metrics import primary_view

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool (Debian's prometheus package) is not installed; make test installs it"
)


@needs_promtool
def test_promtool_accepts_every_query(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{index}", "expr": as_promql(expr)}
                    for index, (_, expr) in enumerate(queries(load_dashboard()))
                ],
            }
        ]
    }
    path = tmp_path / "dashboard.rules.json"  # JSON is YAML: promtool reads it as is
    path.write_text(json.dumps(rules))
    result = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules['groups'][0]['rules'])} rules found" in result.stdout


@needs_promtool
def test_promtool_rejects_a_broken_query(tmp_path: Path) -> None:
    """The check above can fail: a query with a typo does not pass."""
    assert PROMTOOL is not None
    path = tmp_path / "broken.rules.json"
    broken = as_promql("sum by (worker) (rate(hetps_pushes_total[$__rate_interval])")
    path.write_text(json.dumps({"groups": [{"name": "g", "rules": [{"record": "r", "expr": broken}]}]}))
    assert subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True).returncode != 0


@needs_promtool
def test_the_example_prometheus_config_is_valid() -> None:
    assert PROMTOOL is not None
    config = DOCKER / "prometheus" / "prometheus.yml"
    result = subprocess.run([PROMTOOL, "check", "config", str(config)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


class _Cluster(threading.Thread):
    """512 workers' events fed to a shard's metrics: worker i computes 1 + i % 8 times slower than
    the fastest, worker-007 is refused now and then. Time runs 60 times faster for the metrics, so that
    who has series of their own is revised every half second."""

    def __init__(self, metrics: ShardMetrics, workers: list[WorkerRecord]) -> None:
        super().__init__(daemon=True)
        self.metrics = metrics
        self.workers = workers
        self.done = threading.Event()

    def run(self) -> None:
        metrics, clock, step = self.metrics, 0, 0
        pulled = [0] * len(self.workers)
        while not self.done.wait(0.1):
            step += 1
            for i, worker in enumerate(self.workers):
                if (step + i) % (1 + i % 8):
                    continue
                clock += 1
                metrics.update_applied(0.001, clock)
                staleness = clock - 1 - pulled[i]
                outcome = PushOutcome(clock, staleness, {"gap": 0.01 * staleness, "scale": 0.5, "local_steps": 4.0})
                metrics.push_applied(worker, outcome)
                metrics.bytes_received(worker, 4096)
                metrics.pulled(worker, clock, 4096)
                pulled[i] = clock
                metrics.heartbeat(worker, {"samples_per_second": 1000.0 / (1 + i % 8), "compute_seconds": 0.01})
            metrics.rejected("future_clock", self.workers[7])
            metrics.rpc_finished("psproto.v1.ParameterServer", "Push", "OK", 0.002)


@needs_prometheus
def test_the_dashboard_reads_at_512_workers(tmp_path: Path) -> None:
    """Against a real Prometheus: every panel shows data (replication's too), at most 32 workers have
    series of their own, and the rest show as one "other workers" line."""
    start = time.time()
    metrics = ShardMetrics(0, {"rule": "gap-aware"}, wall_clock=lambda: start + 60 * (time.time() - start))
    metrics.checkpoint_written()
    metrics.watch_replica(primary_view)  # the shard is a primary with two backups: the replication panels' data
    workers = [WorkerRecord(i, f"worker-{i:03d}", "cpu", False) for i in range(512)]
    for worker in workers:
        metrics.worker_joined(worker)
    cluster = _Cluster(metrics, workers)
    server = serve_metrics(metrics.registry, "127.0.0.1", 0)
    cluster.start()
    try:
        with prometheus(tmp_path, server.port) as base:
            wait_for(lambda: query(base, "count_over_time(hetps_clock[1m]) >= 4"), 30, "four scrapes of the endpoint")
            # Quiet, so that no scrape runs past its timeout on a busy host (a failed scrape marks
            # every series stale until the next one).
            cluster.done.set()
            cluster.join(10)
            dashboard = queries(load_dashboard())
            deadline = time.monotonic() + 30
            while (empty := [w for w, expr in dashboard if not query(base, as_promql(expr))]) and (
                time.monotonic() < deadline
            ):
                time.sleep(0.5)
            assert not empty, f"panels without data: {empty}"
            own = query(base, 'count(count by (worker) ({__name__=~"hetps_.+", worker!=""}))')
            assert 0 < float(own[0]["value"][1]) <= 32
            (pushes,) = [expr for where, expr in dashboard if where == "Pushes per worker / A"]
            lines = {r["metric"].get("worker") for r in query(base, as_promql(pushes))}
            # (A rate over the last minute also shows workers that gave their place up within it.)
            assert "other workers (mean)" in lines and "worker-007" in lines, lines  # worker-007: refused
    finally:
        cluster.done.set()
        cluster.join(10)
        server.close()
