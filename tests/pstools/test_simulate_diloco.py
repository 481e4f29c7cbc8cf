"""``psworker simulate`` runs both DiLoCo rules end to end on digits, and they learn."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pstools.cli import main


@pytest.mark.parametrize("rule", ["diloco", "diloco-dn"])
def test_simulate_runs_and_learns(rule: str, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    args = ["simulate", "--rule", rule, "--rule-opt", "window=10", "--workers", "2", "--speeds", "1:2"]
    args += ["--task", "digits", "--steps", "600", "--eval-every", "600", "--json", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["clock"] == 60  # one push per window of 10 steps
    assert not data["diverged"] and data["test_accuracy"] > 0.5  # chance is 0.1
    if rule == "diloco-dn":
        assert data["telemetry"]["momentum_step"] == pytest.approx(0.25)  # one push in period=4 closes it
