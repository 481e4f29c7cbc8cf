"""The README's demo, run exactly as `make demo` runs it: the local cluster reaches 90 % on digits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(360)]

# The Makefile's `demo` target: $(BIN)/psworker cluster --workers 4 --slowdowns 1,1,2,4 --updates 1500
DEMO_ARGS = ["cluster", "--workers", "4", "--slowdowns", "1,1,2,4", "--updates", "1500"]
DEMO_TIMEOUT_S = 300


def _psworker() -> list[str]:
    """The virtualenv's `psworker` console script, as `make demo` runs it (the module where none is installed)."""
    script = Path(sys.executable).with_name("psworker")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "psworker"]


def test_make_demo_reaches_90_percent(tmp_path: Path) -> None:
    run_dir = tmp_path / "demo"
    result = subprocess.run(
        [*_psworker(), *DEMO_ARGS, "--log-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((run_dir / "report.json").read_text())
    assert report["test_accuracy"] >= 0.90, report
    assert report["clock"] >= 1500, report
    assert [w["slowdown"] for w in report["workers"]] == [1.0, 1.0, 2.0, 4.0]
    assert all(w["pushes"] > 0 for w in report["workers"]), report
    assert f"final test accuracy {report['test_accuracy']:.4f}" in result.stdout
