"""``benchmarks.gpu_step``: a real ResNet-18 step against a live shard, timed phase by phase."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.gpu_step import PHASES, main


def test_a_cpu_step_is_timed_phase_by_phase(tmp_path: Path) -> None:
    # Two shards: the step's fan-out to several servers is in every phase (one shard is its simple case).
    shards = 2
    out = tmp_path / "gpu_step.json"
    main(
        [
            "--variants",
            "cpu",
            "--steps",
            "2",
            "--cpu-steps",
            "2",
            "--batch",
            "2",
            "--image-size",
            "32",
            "--shards",
            str(shards),
            "--torch-threads",
            "1",
            "--out",
            str(out),
        ]
    )
    results = json.loads(out.read_text())
    cpu = results["variants"]["cpu"]
    assert set(cpu) == set(PHASES)
    assert all(cpu[phase]["n"] == 2 and cpu[phase]["median"] > 0 for phase in PHASES)
    # The parts add up to the whole step (each a median, so only roughly).
    parts = sum(cpu[phase]["median"] for phase in PHASES if phase != "step")
    assert parts == pytest.approx(cpu["step"]["median"], rel=0.5)
    assert results["ratios"] == {}  # nothing to compare a lone variant with
    assert results["shards"] == shards and results["torch_threads"] == 1
    assert results["command"].startswith("python -m benchmarks.gpu_step --variants cpu")
