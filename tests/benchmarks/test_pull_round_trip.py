"""``pull_round_trip``: a worker's Pull through both channel forms, timed in turn, with a verdict per
pull dtype, and usage errors for what the command line can get wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.harness.stats import verdict
from benchmarks.pull_round_trip import FORMS, form_options, main
from psworker.channels import SINGLE_THREADED_PULLS, channel_options


def test_the_threaded_form_differs_from_the_workers_channel_only_in_how_pulls_are_read() -> None:
    assert form_options("single") == channel_options()
    assert SINGLE_THREADED_PULLS not in form_options("threaded")
    assert [*form_options("threaded"), SINGLE_THREADED_PULLS] == channel_options()


def test_a_smoke_run_pulls_through_both_forms_and_judges_them_repeat_by_repeat(tmp_path: Path) -> None:
    out = tmp_path / "pulls.json"
    main(["--smoke", "--parameters", "5000", "--wire", "fp32,bf16", "--out", str(out)])
    results = json.loads(out.read_text())
    command = f"python -m benchmarks.pull_round_trip --smoke --parameters 5000 --wire fp32,bf16 --out {out}"
    assert results["command"] == command
    assert results["model"] == "flat-5000" and results["parameters"] == 5000
    assert set(results["wires"]) == {"fp32", "bf16"}
    for row in results["wires"].values():
        for form in FORMS:
            assert len(row["repeat_medians_ms"][form]) == results["repeats"] == 2
            assert all(ms > 0 for ms in row["repeat_medians_ms"][form])
            assert row["client_cpu_ms_per_pull"][form] > 0
        medians = row["repeat_medians_ms"]
        ratios = [t / s for s, t in zip(medians["single"], medians["threaded"], strict=True)]
        assert row["threaded_over_single"]["min"] == pytest.approx(min(ratios))
        assert row["verdict"] == verdict(row["threaded_over_single"])


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--wire", "int8"], "--wire: int8; choose from"),
        (["--wire", ","], "--wire: none given"),
        (["--parameters", "0"], "--parameters must be at least 1"),
        (["--repeats", "0"], "--repeats and --pulls must be at least 1"),
    ],
)
def test_what_the_command_line_gets_wrong_is_a_usage_error(
    args: list[str], problem: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["--smoke", *args, "--out", str(tmp_path / "pulls.json")])
    assert refused.value.code == 2
    assert problem in capsys.readouterr().err
