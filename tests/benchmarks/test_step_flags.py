"""``step_flags``: every set of flags stepped beside plain hetps on servers of its own, and a verdict per wire form."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.harness.step_systems import HETPS_VARIANTS
from benchmarks.step_flags import WIRE_FORMS, main, verdict


def test_a_verdict_needs_every_repeat_to_agree() -> None:
    assert verdict({"median": 1.1, "min": 1.01, "max": 1.2}) == "faster"
    assert verdict({"median": 0.9, "min": 0.8, "max": 0.99}) == "slower"
    assert verdict({"median": 1.1, "min": 0.99, "max": 1.2}) == "level"


def test_a_smoke_run_steps_every_variant_and_judges_each_against_plain_hetps(tmp_path: Path) -> None:
    out = tmp_path / "step_flags.json"
    main(["--smoke", "--repeats", "1", "--out", str(out)])
    results = json.loads(out.read_text())
    assert results["command"] == f"python -m benchmarks.step_flags --smoke --repeats 1 --out {out}"
    systems = results["steps"]["tiny"]["systems"]
    # Plain hetps, each variant and both movers, at every wire form; each stepped in the timed repeat.
    assert {system["kind"] for system in systems.values()} == {"hetps", *HETPS_VARIANTS, "bare", "arith"}
    assert len(systems) == (len(HETPS_VARIANTS) + 3) * len(WIRE_FORMS)
    assert all(len(system["repeat_medians_ms"]) == 1 for system in systems.values())
    ratios = results["steps"]["tiny"]["speed_ratios"]
    assert "ahead-1shard-fp32 vs hetps-1shard-fp32" in ratios and not any("peer" in pair for pair in ratios)
    assert set(results["verdicts"]) == set(HETPS_VARIANTS)
    for rows in results["verdicts"].values():
        assert set(rows) == set(WIRE_FORMS)
        for row in rows.values():
            assert row["verdict"] == verdict(row["vs hetps"]) and row["hetps vs bare"] > 0


def test_a_subset_of_variants_is_stepped_alone_and_an_unknown_one_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "step_flags.json"
    main(["--smoke", "--repeats", "1", "--variants", "receive", "--out", str(out)])
    results = json.loads(out.read_text())
    assert {system["kind"] for system in results["steps"]["tiny"]["systems"].values()} == {
        "hetps",
        "receive",
        "bare",
        "arith",
    }
    assert set(results["verdicts"]) == {"receive"}
    with pytest.raises(SystemExit) as refused:
        main(["--smoke", "--variants", "receive,fastest", "--out", str(out)])
    assert refused.value.code == 2
    assert "--variants: fastest; choose from ahead, during" in capsys.readouterr().err
