"""Two ``psworker train`` processes train the digits CNN against a live server (the local cluster end to
end is ``make demo``, tests/integration/test_demo_integ.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import StartServer
from tests.integration.workers import WarmTrain, train_command

pytestmark = pytest.mark.integration


def _worker(address: str, name: str, slowdown: float, log: Path) -> WarmTrain:
    command = train_command(
        address, name, 1000, seed=int(name[-1]), slowdown=slowdown, log=log, settings={"train": {"eval_every": 100}}
    )
    return WarmTrain(command, log.with_suffix(".out"))


def test_two_workers_reach_90_percent(start_psserver: StartServer, tmp_path: Path) -> None:
    address = start_psserver("asgd", lr=0.05)
    workers = [_worker(address, f"w{i}", 1.0 + i, tmp_path / f"w{i}.jsonl") for i in range(2)]
    summaries = []
    for process in workers:
        out, err = process.communicate(timeout=240)
        assert process.returncode == 0, err
        summaries.append(json.loads(out.strip().splitlines()[-1]))
    for summary in summaries:
        assert summary["test_accuracy"] >= 0.90, summary
        assert summary["final_clock"] >= 1000
    assert sum(s["pushes"] for s in summaries) >= 1000
    # The slower worker's gradients are staler on average.
    assert summaries[1]["mean_staleness"] >= summaries[0]["mean_staleness"]
    events = [json.loads(line)["event"] for line in (tmp_path / "w0.jsonl").read_text().splitlines()]
    assert events[0] in {"init", "start"} and "eval" in events and events[-1] == "done"


def test_cluster_cli_rejects_mismatched_slowdowns() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "psworker", "cluster", "--workers", "3", "--slowdowns", "1,2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "2 slowdown(s) for 3 worker(s)" in result.stderr
