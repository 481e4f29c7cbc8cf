"""A real Prometheus (Debian's package) scrapes a live cluster of a fast and a slow worker.

The cluster is frozen (SIGSTOP) once both workers have sent heartbeats, so that what
Prometheus scraped can be compared exactly with the server's Status RPC.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from psproto.v1 import ps_pb2, ps_pb2_grpc
from psserver.ready import wait_for_ready_file
from pstools.warm_start import stop_process
from tests.docker.test_dashboard import as_promql, load_dashboard, queries
from tests.integration.probes import wait_for

pytestmark = pytest.mark.integration

PROMETHEUS = shutil.which("prometheus")
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="Debian's prometheus is not installed; make test installs it (apt-get install prometheus)",
)

# Dashboard queries that have nothing to show in this cluster: no checkpoints, ASGD measures no
# gap and assigns no local steps (DyLU), and no joined worker is refused.
MAY_BE_EMPTY = {
    "Checkpoint age / A",
    "Mean gap per worker / A",
    "Local steps assigned per worker (DyLU) / A",
    "Rejected requests by reason / B",
}
# The Replication row: a lone server exports no replica metrics, so these show nothing.
REPLICATION = {
    f"{title} / {ref}"
    for title, refs in (
        ("Role per replica", "A"),
        ("Epoch per replica", "A"),
        ("Failovers", "A"),
        ("Digest mismatches", "A"),
        ("Backups in sync", "AB"),
        ("Backup lag (changes)", "A"),
        ("Backup lag (seconds)", "A"),
        ("Backup lag (bytes)", "A"),
    )
    for ref in refs
}


@dataclass
class Server:
    process: subprocess.Popen[str]
    address: str
    metrics_port: int | None  # None with --metrics-port off


@contextmanager
def psserver(tmp_path: Path, *args: str) -> Iterator[Server]:
    ready_file = tmp_path / "psserver-ready.json"
    command = [sys.executable, "-m", "psserver", "serve", "--host", "127.0.0.1", "--port", "0"]
    process = subprocess.Popen(
        [*command, "--ready-file", str(ready_file), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        ready = wait_for_ready_file(ready_file, process)
        yield Server(process, ready.address, ready.metrics_port)
    finally:
        assert stop_process(process) == 0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def prometheus(tmp_path: Path, metrics_port: int | None) -> Iterator[str]:
    assert PROMETHEUS is not None and metrics_port is not None
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 500ms, scrape_timeout: 400ms}\n"
        "scrape_configs:\n"
        f"  - job_name: hetps\n    static_configs: [{{targets: ['127.0.0.1:{metrics_port}']}}]\n"
    )
    port = free_port()
    command = [
        PROMETHEUS,
        f"--config.file={config}",
        f"--web.listen-address=127.0.0.1:{port}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        "--log.level=warn",
    ]
    with (tmp_path / "prometheus.log").open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(base), 30, f"Prometheus did not become ready; see {tmp_path / 'prometheus.log'}")
        yield base
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def query(base: str, promql: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    with urllib.request.urlopen(url, timeout=10) as reply:
        body = json.load(reply)
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def by_worker(base: str, promql: str) -> dict[str, float]:
    return {r["metric"]["worker"]: float(r["value"][1]) for r in query(base, promql)}


def scalar(base: str, promql: str) -> float | None:
    result = query(base, promql)
    return float(result[0]["value"][1]) if result else None


def worker(address: str, name: str, slowdown: float, log: Path) -> subprocess.Popen[bytes]:
    config = log.with_suffix(".toml")
    config.write_text("torch_threads = 1\n[train]\neval_every = 0\nprogress = false\n")
    command = [
        sys.executable, "-m", "psworker", "train", "--server", address, "--name", name, "--slowdown", str(slowdown),
        "--until-clock", "1000000", "--config", str(config),
    ]  # fmt: skip
    return subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def scrape(metrics_port: int | None) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as reply:
        return str(reply.read().decode())


def check_per_worker_series(base: str, status: ps_pb2.StatusResponse) -> None:
    """Each worker's series agree with the Status RPC, and show the slow worker slower and staler."""
    pushes = by_worker(base, "hetps_pushes_total")
    pulls = by_worker(base, "hetps_pulls_total")
    counts = by_worker(base, "hetps_push_staleness_count")
    means = by_worker(base, "hetps_push_staleness_sum / hetps_push_staleness_count")
    speeds = by_worker(base, "hetps_worker_samples_per_second")
    for w in status.workers:
        assert pushes[w.worker_name] == counts[w.worker_name] == w.pushes
        assert pulls[w.worker_name] == w.pulls
        assert means[w.worker_name] == pytest.approx(w.mean_staleness)
        assert speeds[w.worker_name] == pytest.approx(w.stats["samples_per_second"])

    # The slower worker computes more slowly and its gradients arrive staler.
    assert speeds["fast-worker"] > 2 * speeds["slow-worker"]
    assert means["slow-worker"] > means["fast-worker"]
    p90 = by_worker(base, "histogram_quantile(0.9, sum by (worker, le) (hetps_push_staleness_bucket))")
    assert p90["slow-worker"] >= p90["fast-worker"]
    assert set(by_worker(base, "hetps_push_staleness_bucket")) == {"fast-worker", "slow-worker"}


@needs_prometheus
def test_prometheus_sees_per_worker_staleness_that_agrees_with_status(tmp_path: Path) -> None:
    with (
        psserver(tmp_path, "--rule", "asgd", "--lr", "0.05", "--metrics-port", "0") as server,
        prometheus(tmp_path, server.metrics_port) as base,
        grpc.insecure_channel(server.address) as channel,
    ):
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        workers = {
            "fast-worker": worker(server.address, "fast-worker", 1.0, tmp_path / "fast.log"),
            "slow-worker": worker(server.address, "slow-worker", 4.0, tmp_path / "slow.log"),
        }
        try:
            for _ in range(3):  # refused: counted by reason, with no worker to blame
                with pytest.raises(grpc.RpcError):
                    stub.Heartbeat(ps_pb2.HeartbeatRequest(worker_id=999), timeout=5)

            def both_reported_speed() -> bool:
                status = stub.Status(ps_pb2.StatusRequest(), timeout=5)
                speeds = [w.stats.get("samples_per_second", 0.0) for w in status.workers]
                return len(speeds) == 2 and all(speed > 0 for speed in speeds)

            wait_for(both_reported_speed, 60, "the workers never sent a heartbeat with their speed")
            for process in workers.values():
                process.send_signal(signal.SIGSTOP)
            time.sleep(0.5)  # requests already inside the server finish
            status: ps_pb2.StatusResponse = stub.Status(ps_pb2.StatusRequest(), timeout=5)
            wait_for(
                lambda: scalar(base, "hetps_updates_applied_total") == status.applied_pushes,
                20,
                "Prometheus never scraped the frozen cluster",
            )

            # The totals agree with the Status RPC.
            assert status.applied_pushes > 50
            assert scalar(base, "hetps_clock") == status.clock
            assert scalar(base, "sum(hetps_pushes_total)") == sum(w.pushes for w in status.workers)
            assert scalar(base, 'hetps_rejected_requests_total{reason="unknown_worker"}') == 3
            assert status.rejected["unknown_worker"] == 3
            assert scalar(base, 'hetps_active_workers{role="worker"}') == 2
            check_per_worker_series(base, status)

            # Every dashboard query runs on the real server, and shows data where this cluster has some.
            dashboard = queries(load_dashboard())
            assert {where for where, _ in dashboard} >= REPLICATION
            for where, expr in dashboard:
                result = query(base, as_promql(expr))
                if where in REPLICATION:
                    assert not result, f"{where}: a lone server shows {result}"
                else:
                    assert result or where in MAY_BE_EMPTY, f"{where}: no data for {expr}"
        finally:
            for process in workers.values():
                process.send_signal(signal.SIGCONT)
                process.send_signal(signal.SIGINT)  # the worker leaves the server on its way out
            for process in workers.values():
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()

        # A departed worker's series are gone from the endpoint, and so from Prometheus.
        wait_for(lambda: 'worker="' not in scrape(server.metrics_port), 10, "departed workers' series remain")
        wait_for(lambda: not query(base, "hetps_push_staleness_count"), 10, "Prometheus still shows departed workers")
        assert scalar(base, 'hetps_active_workers{role="worker"}') == 0
        # A push frozen mid-stream may have been applied on the way out; the totals still agree.
        final: ps_pb2.StatusResponse = stub.Status(ps_pb2.StatusRequest(), timeout=5)
        assert not final.workers
        wait_for(
            lambda: scalar(base, "hetps_updates_applied_total") == final.applied_pushes == final.clock,
            10,
            "Prometheus's total differs from the server's",
        )


def test_metrics_port_off_turns_the_endpoint_off(tmp_path: Path) -> None:
    with psserver(tmp_path, "--metrics-port", "off") as server, grpc.insecure_channel(server.address) as channel:
        assert server.metrics_port is None
        reply = ps_pb2_grpc.ParameterServerStub(channel).Status(ps_pb2.StatusRequest(), timeout=10)
        assert reply.clock == 0  # serving, without metrics
