"""Two shards and compressed wire dtypes train as well as one shard in fp32."""

from __future__ import annotations

from pathlib import Path

import pytest

from psworker.launcher import ClusterConfig, run_cluster

pytestmark = pytest.mark.integration


def test_two_shards_train_digits(tmp_path: Path) -> None:
    report = run_cluster(
        ClusterConfig(workers=2, slowdowns=(1.0, 2.0), shards=2, until_clock=1000, log_dir=tmp_path / "two")
    )
    assert report.test_accuracy >= 0.90
    # Each shard keeps its own clock; the report shows the slowest, and every shard got every push.
    assert report.clock >= 1000
    assert all(w.pushes > 0 for w in report.workers)


def test_bf16_on_the_wire_trains_digits(tmp_path: Path) -> None:
    report = run_cluster(
        ClusterConfig(workers=2, slowdowns=(1.0, 2.0), wire_dtype="bf16", until_clock=1000, log_dir=tmp_path)
    )
    assert report.test_accuracy >= 0.90
