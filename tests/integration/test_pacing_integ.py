"""``psworker train`` with a step time and ``--max-seconds``: steps of a set length, a time limit."""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.integration.conftest import StartServer
from tests.integration.workers import WarmTrain, train_command


def test_a_paced_worker_steps_at_its_emulated_speed_and_stops_at_its_time_limit(
    start_psserver: StartServer, tmp_path: Path
) -> None:
    address = start_psserver("asgd", lr=0.05)
    command = train_command(
        address, "paced", 10**9, slowdown=2.0, settings={"train": {"step_seconds": 0.02}}, extra=["--max-seconds", "2"]
    )
    started = time.monotonic()
    worker = WarmTrain(command, tmp_path / "paced.out")
    output, _ = worker.communicate(timeout=120)
    assert worker.returncode == 0, output
    summary = json.loads(output.strip().splitlines()[-1])
    # Each step lasts at least 2 × 0.02 s, so 2 s hold at most 50 of them; a push per step.
    assert 5 <= summary["steps"] <= 51
    assert summary["pushes"] == summary["steps"]
    assert time.monotonic() - started < 60
