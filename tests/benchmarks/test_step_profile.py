"""``benchmarks.step_profile``: both systems profiled on both sides, CPU put in groups, wrong options refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.harness.profiled import main as profiled
from benchmarks.step_profile import C_THREADS, GROUPS, OTHER, group_of, grouped, main
from tests.benchmarks.refused import assert_refused


def test_functions_fall_into_the_groups_that_name_them() -> None:
    assert group_of("/x/site-packages/grpc/_server.py", "_send_response") == "gRPC Python layer (+ its C calls)"
    assert (
        group_of("builtins", "<method 'copy_' of 'torch._C.TensorBase' objects>")
        == "buffer copies and dtype conversions"
    )
    assert group_of("builtins", "<method 'join' of 'bytes' objects>") == "buffer copies and dtype conversions"
    assert group_of("builtins", "<method 'sum' of 'torch._C.TensorBase' objects>") == "finiteness sum"
    assert group_of("builtins", "<method 'add_' of 'torch._C.TensorBase' objects>") == "tensor math"
    assert group_of("/usr/lib/python3.11/threading.py", "Condition.wait") == "thread hand-offs"
    assert (
        group_of("builtins", "<method 'to' of 'torch._C.TensorBase' objects>") == "buffer copies and dtype conversions"
    )
    assert group_of("/repo/psproto/_block_kernel.py", "_encode") == "8-bit codec"
    assert group_of("/somewhere/else.py", "f") == OTHER
    # Own times per step add up: 30 ms over 3 steps in two groups.
    functions = [
        {"module": "builtins", "name": "<method 'copy_' of 'torch._C.TensorBase' objects>", "own_s": 0.02},
        {"module": "builtins", "name": "<method 'sum' of 'torch._C.TensorBase' objects>", "own_s": 0.01},
    ]
    assert grouped(functions, 3) == pytest.approx(
        {"buffer copies and dtype conversions": 20 / 3, "finiteness sum": 10 / 3}
    )


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


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--against", "peer"], "invalid choice"),
        (["--wire", "bf16/int8"], "is for pushes only"),
        (["--wire", "int9"], "int9"),
        (["--steps", "0"], "must be at least 1"),
        (["--model", "vgg"], "invalid choice"),
    ],
)
def test_wrong_options_exit_2_with_what_to_fix(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert_refused(main, argv, message, tmp_path, capsys)


def test_the_profiled_wrapper_refuses_a_server_it_does_not_know(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        profiled(["--stats", "out.json", "nginx"])
    assert stopped.value.code == 2
    assert "invalid choice: 'nginx'" in capsys.readouterr().err
