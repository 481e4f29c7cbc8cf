"""``benchmarks.gpu_step``: the model it steps and its refusals (a real step: test_gpu_step_integ.py)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.gpu_step import main
from benchmarks.harness.models import resnet18_shapes
from benchmarks.harness.resnet import ResNet18


def test_the_trainable_resnet_has_the_shapes_the_data_path_benchmarks_use() -> None:
    model = ResNet18()
    assert [(name, tuple(p.shape)) for name, p in model.named_parameters()] == resnet18_shapes()
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 1000)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--variants", "tpu"], "choose from cuda, cuda-pageable, cuda-host-encode, cpu"),
        (["--variants", "cpu", "--steps", "0"], "must be at least 1"),
        (["--variants", "cpu", "--shards", "0"], "must be at least 1"),
        (["--variants", "cpu", "--torch-threads", "0"], "--torch-threads must be at least 1"),
        (["--variants", "cpu", "--wire", "int9"], "--wire int9: pull dtype 'int9' is not one of"),
        (["--variants", "cpu", "--wire", "bf16/int8"], "--wire bf16/int8:"),
    ],
)
def test_wrong_options_exit_2_with_what_to_fix(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a host without CUDA")
def test_a_cuda_variant_without_a_gpu_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--variants", "cuda"])
    assert exited.value.code == 2
    assert "no CUDA device is available" in capsys.readouterr().err
