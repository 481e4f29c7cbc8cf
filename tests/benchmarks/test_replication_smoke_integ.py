"""``benchmarks.replication --smoke``: every section (cost, sustained rate, failover) runs once on a tiny
model against real replicas and one etcd, and writes what the docs read. Not a timing test."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks.replication import main

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("etcd") is None, reason="Debian's etcd is not installed; make test installs it"),
]


def test_a_smoke_run_measures_cost_sustained_rate_and_a_failover(tmp_path: Path) -> None:
    out = tmp_path / "replication.json"
    main(["--smoke", "--out", str(out)])
    results = json.loads(out.read_text())
    cost = results["cost"]
    idle = cost["idle"]["percent_of_a_core"]
    assert set(idle) == {"lone", "primary", "backup", "etcd"} and min(idle.values()) >= 0
    assert {name: summary["n"] for name, summary in cost["step_ms"].items()} == {"lone": 6, "one backup": 6}
    assert cost["ratio"]["n"] == 2 and cost["ratio"]["median"] > 0
    sustained = results["sustained"]
    for system in ("lone", "one backup"):
        measured = sustained[system]
        assert measured["updates"] == 2 * 80  # two workers' every step, the warm-up ones left out
        assert len(measured["quarter_updates_per_s"]) == 4 and min(measured["quarter_updates_per_s"]) > 0
        assert measured["last_over_first"] == pytest.approx(
            measured["quarter_updates_per_s"][3] / measured["quarter_updates_per_s"][0]
        )
    assert sustained["target"]["pass"] == (sustained["one backup"]["last_over_first"] >= 0.7)
    failover = results["failover"]
    assert failover["failovers_seen"] == 1 and len(failover["kill_to_first_ack_s"]) == 1
    assert failover["exactly_once"] and failover["applied_pushes"] == failover["acknowledged_steps"] > 0
    assert results["command"] == f"python -m benchmarks.replication --smoke --out {out}"
