"""``call_forms`` smoke runs: a worker's Pull and Push made both ways against a served shard."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.call_forms import FORMS, main
from benchmarks.harness.stats import verdict


def test_a_smoke_run_makes_each_call_both_ways_and_judges_them_repeat_by_repeat(tmp_path: Path) -> None:
    out = tmp_path / "calls.json"
    main(["--smoke", "--parameters", "5000", "--wire", "fp32,bf16", "--out", str(out)])
    results = json.loads(out.read_text())
    assert (
        results["command"] == f"python -m benchmarks.call_forms --smoke --parameters 5000 --wire fp32,bf16 --out {out}"
    )
    assert results["model"] == "flat-5000" and results["parameters"] == 5000
    assert set(results["calls"]) == {"pull", "push"}
    for call, rows in results["calls"].items():
        assert set(rows) == {"fp32", "bf16"}
        lighter, other = FORMS[call]
        for row in rows.values():
            medians = row["repeat_medians_ms"]
            assert set(medians) == {lighter, other}
            assert all(len(medians[form]) == results["repeats"] == 2 for form in medians)
            assert all(ms > 0 for form in medians for ms in medians[form])
            assert all(cpu > 0 for cpu in row["client_cpu_ms_per_call"].values())
            ratios = [o / f for f, o in zip(medians[lighter], medians[other], strict=True)]
            assert row["other_over_lighter"]["min"] == pytest.approx(min(ratios))
            assert row["verdict"] == verdict(row["other_over_lighter"])
    # 5,000 parameters are one chunk in either dtype: the push rows compare PushUnary with the stream.
    assert all(row["one_message"] for row in results["calls"]["push"].values())


def test_a_push_of_more_than_a_chunk_is_said_to_be_streams_both_ways(tmp_path: Path) -> None:
    out = tmp_path / "calls.json"
    main(["--smoke", "--parameters", "300000", "--calls", "push", "--wire", "fp32", "--out", str(out)])
    (row,) = json.loads(out.read_text())["calls"]["push"].values()
    assert row["one_message"] is False
