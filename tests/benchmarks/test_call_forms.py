"""``call_forms``: a worker's Pull and Push made both ways, timed in turn, with a verdict per call and
wire dtype, and usage errors for what the command line can get wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.call_forms import FORMS, form_options, main
from benchmarks.harness.stats import verdict
from psworker.channels import SINGLE_THREADED_PULLS, channel_options


def test_the_threaded_pull_differs_from_a_small_shards_channel_only_in_how_pulls_are_read() -> None:
    assert form_options("single") == channel_options(single_threaded_pulls=True)
    assert [*form_options("threaded"), SINGLE_THREADED_PULLS] == form_options("single")


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


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--wire", "int8"], "--wire: int8; choose from"),
        (["--wire", ","], "--wire: none given"),
        (["--calls", "pull,init"], "--calls: init; choose from pull, push"),
        (["--parameters", "0"], "--parameters must be at least 1"),
        (["--repeats", "0"], "--repeats and --calls-per-repeat must be at least 1"),
    ],
)
def test_what_the_command_line_gets_wrong_is_a_usage_error(
    args: list[str], problem: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["--smoke", *args, "--out", str(tmp_path / "calls.json")])
    assert refused.value.code == 2
    assert problem in capsys.readouterr().err
