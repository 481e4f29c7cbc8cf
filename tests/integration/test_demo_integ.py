"""The README's demo, run exactly as `make demo` runs it: the local cluster reaches 90 % on digits."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(360)]

MAKEFILE = Path(__file__).resolve().parents[2] / "Makefile"
DEMO_TIMEOUT_S = 300


def demo_args() -> list[str]:
    """The arguments of `psworker` in the Makefile's `demo` recipe, so the test runs what `make demo` runs."""
    lines = MAKEFILE.read_text().splitlines()
    recipe = lines[lines.index(next(line for line in lines if line.startswith("demo:"))) + 1]
    command = shlex.split(recipe)
    assert command[0] == "$(BIN)/psworker", recipe
    return command[1:]


def _psworker() -> list[str]:
    """The virtualenv's `psworker` console script, as `make demo` runs it (the module where none is installed)."""
    script = Path(sys.executable).with_name("psworker")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "psworker"]


def test_make_demo_reaches_90_percent(tmp_path: Path) -> None:
    run_dir = tmp_path / "demo"
    result = subprocess.run(
        [*_psworker(), *demo_args(), "--log-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads((run_dir / "report.json").read_text())
    assert report["test_accuracy"] >= 0.90, report
    args = demo_args()
    assert report["clock"] >= int(args[args.index("--updates") + 1]), report
    slowdowns = [float(s) for s in args[args.index("--slowdowns") + 1].split(",")]
    workers = report["workers"]
    assert [(w["name"], w["slowdown"]) for w in workers] == [(f"worker-{r}", s) for r, s in enumerate(slowdowns)]
    assert all(w["pushes"] > 0 for w in workers), report
    # The slowest worker steps least, and its gradients are the stalest.
    slow, fast = max(workers, key=lambda w: w["slowdown"]), min(workers, key=lambda w: w["slowdown"])
    assert slow["steps"] < fast["steps"] and slow["mean_staleness"] > fast["mean_staleness"], report
    assert f"final test accuracy {report['test_accuracy']:.4f}" in result.stdout
