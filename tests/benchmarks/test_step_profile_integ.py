"""``benchmarks.step_profile`` smoke runs: both systems profiled on both sides, CPU put in groups."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.step_profile import C_THREADS, GROUPS, OTHER, main


def test_a_smoke_run_profiles_both_servers_and_clients(tmp_path: Path) -> None:
    out = tmp_path / "step_profile.json"
    assert main(["--smoke", "--steps", "4", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["steps"] == 4 and results["model"] == "tiny"
    hetps, bare = results["systems"]["hetps"], results["systems"]["bare"]
    names = {group for group, _ in GROUPS} | {OTHER, C_THREADS}
    for side in (hetps["server"], bare["server"], hetps["client"], bare["client"]):
        assert set(side["groups_ms_per_step"]) <= names
        assert sum(side["groups_ms_per_step"].values()) > 0
        assert side["top"] and all(row["own_ms_per_step"] >= 0 for row in side["top"])
    # Only hetps's server runs the rule (tensor math) and its own code; only the bare one runs the mover's.
    hetps_server, bare_server = hetps["server"]["groups_ms_per_step"], bare["server"]["groups_ms_per_step"]
    assert hetps_server.get("hetps Python code", 0) > 0 and bare_server.get("hetps Python code", 0) == 0
    assert hetps_server.get("tensor math", 0) > 0
    assert bare_server.get("bare mover's code (its copies included)", 0) > 0
    assert hetps_server.get("bare mover's code (its copies included)", 0) == 0
    assert results["command"].startswith("python -m benchmarks.step_profile --smoke")


def test_with_8_bit_pushes_hetps_is_profiled_alone_and_its_worker_encodes(tmp_path: Path) -> None:
    out = tmp_path / "step_profile.json"
    assert main(["--smoke", "--wire", "int8/bf16", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert set(results["systems"]) == {"hetps"}
    assert results["systems"]["hetps"]["client"]["groups_ms_per_step"].get("8-bit codec", 0) > 0


def test_against_the_arithmetic_mover_both_sides_of_an_8_bit_step_are_profiled(tmp_path: Path) -> None:
    out = tmp_path / "step_profile.json"
    assert main(["--smoke", "--wire", "int8/bf16", "--against", "arith", "--steps", "4", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert set(results["systems"]) == {"hetps", "arith"}
    arith = results["systems"]["arith"]
    # Its worker encodes with error feedback; its server runs the mover's code and hetps's decode
    # (codec.Assembler), never hetps's server.
    assert arith["client"]["groups_ms_per_step"].get("8-bit codec", 0) > 0
    assert arith["server"]["groups_ms_per_step"].get("bare mover's code (its copies included)", 0) > 0
    assert arith["server"]["groups_ms_per_step"].get("hetps Python code", 0) > 0
    functions = [row["function"] for row in arith["server"]["top"]]
    assert not any(name.startswith(("servicer.py", "shard.py", "receiving.py")) for name in functions)
