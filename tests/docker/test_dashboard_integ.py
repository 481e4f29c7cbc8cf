"""The Grafana dashboard's queries and the example Prometheus config, checked by Prometheus's own promtool."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.docker.test_dashboard import DOCKER, as_promql, load_dashboard, queries

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
