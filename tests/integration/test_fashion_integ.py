"""Real processes on the real Fashion-MNIST files: two workers on disjoint halves learn the task.

Skipped with a message where the files are absent (``make test`` installs Debian's
``dataset-fashion-mnist`` where it can)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pstasks.fashion import FILES, data_dir_or_default
from pstools.launcher import ClusterConfig, run_cluster

DATA_DIR = data_dir_or_default()
HAVE_DATA = all(
    (DATA_DIR / f"{name}.gz").is_file() or (DATA_DIR / name).is_file() for pair in FILES.values() for name in pair
)

pytestmark = pytest.mark.skipif(
    not HAVE_DATA,
    reason=f"Fashion-MNIST is not in {DATA_DIR}: `apt-get install dataset-fashion-mnist` (or set $HETPS_DATA_DIR)",
)


UPDATES = 150


def test_two_workers_on_disjoint_halves_learn_fashion(tmp_path: Path) -> None:
    report = run_cluster(
        ClusterConfig(
            workers=2,
            slowdowns=(1.0, 1.0),
            rule="momentum",
            lr=0.01,
            task="fashion",
            until_clock=UPDATES,
            data_dir=DATA_DIR,
            log_dir=tmp_path,
            timeout_s=120,
        )
    )
    # Chance is 0.10; 150 updates of batch 64 (a sixth of an epoch) reach about 0.75 (loss 0.6-0.8).
    assert report.test_accuracy >= 0.6, report
    assert report.clock >= UPDATES
    starts = [
        next(
            json.loads(line)
            for line in (tmp_path / f"worker-{rank}.jsonl").read_text().splitlines()
            if '"start"' in line
        )
        for rank in range(2)
    ]
    assert [s["data_shard"] for s in starts] == [[0, 2], [1, 2]]
    assert [s["train_examples"] for s in starts] == [30_000, 30_000]
