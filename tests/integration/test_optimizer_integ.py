"""The two-line change: a plain PyTorch loop trains through ParameterServerOptimizer."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from pstasks.tasks import digits
from psworker.optim import ParameterServerOptimizer
from psworker.task import evaluate
from tests.integration.conftest import StartServer
from tests.integration.workers import WarmTrain

pytestmark = pytest.mark.integration


def test_plain_loop_with_the_wrapper_learns(start_psserver: StartServer) -> None:
    address = start_psserver("momentum", lr=0.02)
    task = digits()
    model = task.build_model()
    generator = torch.Generator().manual_seed(0)
    with ParameterServerOptimizer(model, address, name="plain-loop") as opt:
        for _ in range(300):
            index = torch.randint(0, task.train_size, (32,), generator=generator)
            opt.zero_grad()
            loss = task.loss(model(task.train_inputs[index]), task.train_targets[index])
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
        assert opt.client.clock == 300
        assert opt.last is not None and opt.last.staleness == 0
    accuracy, _ = evaluate(model, task, torch.device("cpu"))
    assert accuracy >= 0.9


def test_a_second_model_is_refused_by_the_wrapper(start_psserver: StartServer) -> None:
    import grpc
    from torch import nn

    address = start_psserver()
    with ParameterServerOptimizer(nn.Linear(3, 2), address):
        with pytest.raises(grpc.RpcError) as caught:
            ParameterServerOptimizer(nn.Linear(4, 2), address)
        assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_worker_cli_reports_a_refusal_with_exit_1(start_psserver: StartServer, tmp_path: Path) -> None:
    # Two one-shard servers listed as the two shards of one model: the first refuses the count.
    address, other = start_psserver("momentum"), start_psserver("momentum")
    command = [sys.executable, "-m", "psworker", "train", "--server", address, "--server", other, "--max-steps", "1"]
    worker = WarmTrain(command, tmp_path / "refused.out")
    output, _ = worker.communicate(timeout=120)
    assert worker.returncode == 1, output
    assert "FAILED_PRECONDITION" in output and "same shard count" in output
