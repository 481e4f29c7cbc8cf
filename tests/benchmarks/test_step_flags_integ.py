"""``step_flags``: the variants asked for, stepped beside plain hetps on servers of their own, and a
verdict per wire form. (Every set is stepped by ``throughput --smoke``'s step section, through the same
``measure_steps``.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.step_flags import WIRE_FORMS, main, verdict


def test_a_verdict_needs_every_repeat_to_agree() -> None:
    assert verdict({"median": 1.1, "min": 1.01, "max": 1.2}) == "faster"
    assert verdict({"median": 0.9, "min": 0.8, "max": 0.99}) == "slower"
    assert verdict({"median": 1.1, "min": 0.99, "max": 1.2}) == "level"


def test_a_smoke_run_steps_the_variants_asked_for_and_judges_each_against_plain_hetps(tmp_path: Path) -> None:
    out = tmp_path / "step_flags.json"
    main(["--smoke", "--repeats", "1", "--variants", "streams", "--out", str(out)])
    results = json.loads(out.read_text())
    assert results["command"] == f"python -m benchmarks.step_flags --smoke --repeats 1 --variants streams --out {out}"
    systems = results["steps"]["tiny"]["systems"]
    # Plain hetps, the variant and both movers, at every wire form; each stepped in the timed repeat.
    assert {system["kind"] for system in systems.values()} == {"hetps", "streams", "bare", "arith"}
    assert len(systems) == 4 * len(WIRE_FORMS)
    assert all(len(system["repeat_medians_ms"]) == 1 for system in systems.values())
    ratios = results["steps"]["tiny"]["speed_ratios"]
    assert "streams-1shard-fp32 vs hetps-1shard-fp32" in ratios and not any("peer" in pair for pair in ratios)
    assert set(results["verdicts"]) == {"streams"}
    for rows in results["verdicts"].values():
        assert set(rows) == set(WIRE_FORMS)
        for row in rows.values():
            assert row["verdict"] == verdict(row["vs hetps"]) and row["hetps vs bare"] > 0


def test_an_unknown_variant_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["--smoke", "--variants", "streams,fastest", "--out", str(tmp_path / "step_flags.json")])
    assert refused.value.code == 2
    assert "--variants: fastest; choose from streams" in capsys.readouterr().err
