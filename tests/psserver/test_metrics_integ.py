"""The metrics endpoint over real HTTP, ``psserver serve`` on a metrics port already taken, and the
exposition checked by Prometheus's promtool."""

from __future__ import annotations

import shutil
import socket
import subprocess
import urllib.request

import pytest
from click.testing import CliRunner
from prometheus_client import generate_latest

from psserver.cli import main
from psserver.core.shard import Shard
from psserver.core.workers import PushOutcome
from psserver.metrics import ShardMetrics, serve_metrics
from tests.psserver.test_metrics import metrics, push, shard, time_source  # noqa: F401 (fixtures)


def test_the_endpoint_serves_the_registry_over_http(shard: Shard, metrics: ShardMetrics) -> None:  # noqa: F811
    push(shard, 1, 1, 0)
    server = serve_metrics(metrics.registry, "127.0.0.1", 0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as reply:
            body = reply.read().decode()
    finally:
        server.close()
    assert 'hetps_pushes_total{shard="3",worker="fast"} 1.0' in body
    assert "_created" not in body


def test_serve_refuses_a_metrics_port_in_use_with_a_clear_message() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(
            main, ["serve", "--host", "127.0.0.1", "--port", "0", "--metrics-port", str(port)], terminal_width=200
        )
    assert result.exit_code == 1, result.output
    assert f"cannot serve metrics on 127.0.0.1:{port}" in result.output
    assert "--metrics-port off" in result.output


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian's prometheus package) is not installed")
def test_the_exposition_passes_promtools_lint(shard: Shard, metrics: ShardMetrics) -> None:  # noqa: F811
    push(shard, 1, 1, 0)
    shard.heartbeat(1, {"samples_per_second": 10.0, "compute_seconds": 0.1})
    metrics.push_applied(shard.workers[1], PushOutcome(2, 0, {"gap": 0.1, "scale": 1.0}))
    metrics.rpc_finished("psproto.v1.ParameterServer", "Push", "OK", 0.01)
    metrics.checkpoint_written()
    exposition = generate_latest(metrics.registry)
    result = subprocess.run(["promtool", "check", "metrics"], input=exposition, capture_output=True)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
