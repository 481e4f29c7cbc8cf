"""``benchmarks.push_codec_accuracy`` on a tiny budget: fp32 and int8 runs pair up per rule and seed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.push_codec_accuracy import main


def test_a_tiny_run_pairs_fp32_and_int8_and_judges_the_target(tmp_path: Path) -> None:
    out = tmp_path / "codec.json"
    returned = main(["--task", "digits", "--steps", "40", "--seeds", "0", "--rules", "asgd:0.1", "--out", str(out)])
    results = json.loads(out.read_text())
    assert [(r["rule"], r["push_dtype"], r["updates"]) for r in results["runs"]] == [
        ("asgd", "fp32", 40),
        ("asgd", "int8", 40),
    ]
    fp32, int8 = (r["test_accuracy"] for r in results["runs"])
    (target,) = results["targets"]
    assert target["measured"] == returned["targets"][0]["measured"]
    assert abs(target["measured"] - 100 * (fp32 - int8)) < 1e-9
    assert results["command"].startswith("python -m benchmarks.push_codec_accuracy --task digits")


def test_int8_without_error_feedback_runs_as_a_third_variant_compared_with_fp32(tmp_path: Path) -> None:
    out = tmp_path / "codec.json"
    arguments = ["--task", "digits", "--steps", "40", "--seeds", "0", "--rules", "gap-aware:0.1"]
    main([*arguments, "--variants", "fp32,int8,int8-no-ef", "--out", str(out)])
    results = json.loads(out.read_text())
    assert [(r["variant"], r["push_dtype"], r["error_feedback"]) for r in results["runs"]] == [
        ("fp32", "fp32", True),
        ("int8", "int8", True),
        ("int8-no-ef", "int8", False),
    ]
    fp32, _, without = (r["test_accuracy"] for r in results["runs"])
    assert [t["target"] for t in results["targets"]] == [
        "gap-aware: fp32 − int8 final accuracy (points, mean over seeds)",
        "gap-aware: fp32 − int8-no-ef final accuracy (points, mean over seeds)",
    ]
    assert abs(results["targets"][1]["measured"] - 100 * (fp32 - without)) < 1e-9


def test_the_variants_must_be_known_and_include_fp32(capsys: pytest.CaptureFixture[str]) -> None:
    for variants, message in (("fp32,int4", "unknown variant(s) int4"), ("int8", "must include fp32")):
        with pytest.raises(SystemExit) as exited:
            main(["--variants", variants])
        assert exited.value.code == 2
        assert message in capsys.readouterr().err
