"""The real-cluster check's pure parts: the within-spread judgement, measured speeds, join clocks, the section."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from experiments.repro_real_cluster import (
    join_clocks,
    real_cluster_section,
    relative_speeds,
    replay_fields,
    within_spread,
)
from experiments.reproduce import main


def test_within_spread_is_the_seed_range_widened_by_one_std() -> None:
    values = [0.90, 0.92, 0.94]  # population std 0.01633
    assert within_spread(0.92, values)
    assert within_spread(0.884, values) and within_spread(0.956, values)
    assert not within_spread(0.88, values) and not within_spread(0.96, values)


def test_within_spread_of_one_or_no_value() -> None:
    assert within_spread(0.5, [0.5]) and not within_spread(0.51, [0.5])
    assert not within_spread(0.5, [])


def test_relative_speeds_are_over_the_fastest_worker() -> None:
    assert relative_speeds([[0.02, 0.04], [0.03], [0.09, 0.09]]) == pytest.approx([1.0, 1.0, 3.0])


def _log(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_join_clocks_come_from_each_workers_start_event_in_rank_order(tmp_path: Path) -> None:
    for rank, clock in [(0, 6), (1, 0), (2, 3), (10, 41)]:
        _log(
            tmp_path / f"worker-{rank}.jsonl",
            [{"event": "start", "time": 0.0, "clock": clock}, {"event": "step", "time": 1.0, "step": 10, "clock": 50}],
        )
    _log(tmp_path / "worker-3.jsonl", [{"event": "step", "time": 1.0, "step": 10, "clock": 50}])
    assert join_clocks(tmp_path) == [6, 0, 3, -1, 41]


def _row(rule: str, cluster: float, sims: list[float], ideal: list[float]) -> dict[str, Any]:
    return {
        "rule": rule,
        "cluster_accuracy": cluster,
        "cluster_clock": 301,
        "measured_speeds": [1.0, 1.1, 2.6, 5.2],
        "join_clocks": [0, 4, 2, 9],
        "cluster_staleness": [[1.5, 5], [1.6, 8], [5.5, 16], [11.1, 35]],
        "sim_values": sims,
        "sim_mean": sum(sims) / len(sims),
        "sim_std": 0.01,
        "sim_staleness": [[1.5, 3], [1.6, 4], [5.7, 8], [11.8, 16]],
        "sim_within": within_spread(cluster, sims),
        "ideal_mean": sum(ideal) / len(ideal),
        "ideal_std": 0.0,
        "ideal_values": ideal,
        "ideal_within": within_spread(cluster, ideal),
    }


def test_the_section_counts_the_rows_it_shows() -> None:
    rows = [
        _row("ASGD", 0.90, [0.89, 0.91], [0.95, 0.95]),
        _row("DynSGD", 0.95, [0.90, 0.91], [0.90, 0.92]),
        {"rule": "GEM", "error": "worker-1 exited with 1"},
    ]
    text = real_cluster_section(rows, "python -m experiments.reproduce --only none --real-cluster")
    assert text.startswith("## Real-cluster check\n")
    assert "**1 of 2 rules land within it.**" in text
    assert "would put 0 of 2 within" in text
    assert "Outside: DynSGD (0.950 against 0.905 ± 0.010)." in text
    assert "The cluster failed for: GEM." in text
    assert "`python -m experiments.reproduce --only none --real-cluster`" in text
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(table) == 3  # the header and one line per finished rule
    assert all(line.count("|") == table[0].count("|") for line in table)
    assert "| 1.0:1.1:2.6:5.2 | 0, 4, 2, 9 |" in table[1]
    assert "1.5 / 1.6 / 5.5 / 11.1" in table[2]


def test_replay_fields_summarise_the_seeds_under_one_prefix() -> None:
    runs = {
        seed: {"test_accuracy": accuracy, "staleness": [[1.0, 2], [3.0, 6]], "steps": [10, 5]}
        for seed, accuracy in enumerate([0.90, 0.94])
    }
    fields = replay_fields("ideal", runs, 0.95)
    assert fields["ideal_values"] == [0.90, 0.94]
    assert fields["ideal_mean"] == pytest.approx(0.92) and fields["ideal_std"] == pytest.approx(0.02)
    assert fields["ideal_staleness"] == [[1.0, 2], [3.0, 6]] and fields["ideal_steps"] == [10.0, 5.0]
    assert fields["ideal_within"] is True  # 0.95 <= 0.94 + 0.02
    assert replay_fields("sim", runs, 0.97)["sim_within"] is False


@pytest.mark.parametrize("seeds", ["0", "-2", "many"])
def test_the_check_refuses_a_seed_count_it_cannot_use(
    seeds: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--only", "none", "--real-cluster", "--check-seeds", seeds, "--out", str(tmp_path)])
    assert exited.value.code == 2
    assert "--check-seeds" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # refused before anything ran or was written
