"""``benchmarks.push_codec_accuracy`` on a tiny budget: fp32 and int8 runs pair up per rule and seed."""

from __future__ import annotations

import json
from pathlib import Path

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
