"""``benchmarks.step_profile``: CPU put in groups, wrong options refused (its smoke runs:
test_step_profile_integ.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.harness.profiled import main as profiled
from benchmarks.step_profile import OTHER, group_of, grouped, main
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
