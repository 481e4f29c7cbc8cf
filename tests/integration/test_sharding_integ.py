"""Two shards and compressed wire dtypes train as well as one shard in fp32."""

from __future__ import annotations

from pathlib import Path

import pytest

from psworker.launcher import ClusterConfig, ClusterReport, run_cluster

pytestmark = pytest.mark.integration


def test_two_shards_train_digits_as_well_as_one(tmp_path: Path) -> None:
    def train(shards: int) -> ClusterReport:
        return run_cluster(
            ClusterConfig(
                workers=2, slowdowns=(1.0, 2.0), shards=shards, until_clock=1000, log_dir=tmp_path / f"{shards}"
            )
        )

    one, two = train(1), train(2)
    print(f"one shard {one.test_accuracy:.4f}, two shards {two.test_accuracy:.4f}")
    assert two.test_accuracy >= 0.90
    # Asynchronous runs differ in their interleaving, not in what they reach.
    assert abs(two.test_accuracy - one.test_accuracy) <= 0.05
    # Each shard keeps its own clock; the report shows the slowest, and every shard got every push.
    assert two.clock >= 1000
    assert all(w.pushes > 0 for w in two.workers)


def test_bf16_on_the_wire_trains_digits(tmp_path: Path) -> None:
    report = run_cluster(
        ClusterConfig(workers=2, slowdowns=(1.0, 2.0), wire_dtype="bf16", until_clock=1000, log_dir=tmp_path)
    )
    assert report.test_accuracy >= 0.90
