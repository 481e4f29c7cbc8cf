"""``benchmarks.tinylm_step`` times tinylm's training steps and writes its JSON; a bad step count exits 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.tinylm_step import main


def test_it_times_steps_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "step.json"
    main(["--steps", "2", "--out", str(out)])
    results = json.loads(out.read_text())
    assert results["command"] == f"python -m benchmarks.tinylm_step --steps 2 --out {out}"
    assert 700_000 < results["parameters"] < 1_300_000 and results["batch_size"] == 32
    assert results["wall_ms"]["n"] == 2 and results["cpu_ms"]["median"] > 0
    assert results["targets"][0]["comparison"] == "<="


def test_a_step_count_below_one_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--steps", "0"])
    assert exited.value.code == 2
    assert "--steps must be at least 1" in capsys.readouterr().err
