"""``psworker train --task gpt2-small`` on a CPU against four real ``psserver serve`` shards:
windows of 8 bytes and batch 1 through the task options, 124M parameters pushed and pulled
each step, the shards balanced, every shard's clock advanced, and the model the shards hold
(pulled back as an observer) with a finite validation loss. Where torch sees a CUDA device, the
same with the task's own GPU step (8 windows of 1,024 bytes) and the whole validation set
evaluated on the GPU."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc
import pytest
import torch

from psproto.v1 import ps_pb2, ps_pb2_grpc
from pstasks.tasks import TaskOptions, load_task
from pstools.launcher import evaluate_servers, start_server
from pstools.warm_start import Program, start_program, stop_process
from tests.pstasks.test_gpt2_small import GPT2_SMALL_PARAMETERS

SHARDS = 4
STEPS = 2
RUN = f"""[train]
max_steps = {STEPS}
eval_every = 0
progress = false
"""
# A CPU step: one window of 8 bytes; no evaluation of the whole validation set (minutes on a CPU).
CPU_RUN = f"""torch_threads = 1
[task_options]
batch_size = 1
sequence_length = 8
{RUN}evaluate_at_end = false
device = "cpu"
"""


@pytest.fixture
def shards(tmp_path: Path) -> Iterator[list[str]]:
    started: list[Program] = []
    addresses = []
    try:
        for index in range(SHARDS):
            config = {"shard": {"shard_index": index, "num_shards": SHARDS}}
            process, address = start_server(tmp_path, "asgd", 1e-4, (), config=config)
            started.append(process)
            addresses.append(address)
        yield addresses
    finally:
        codes = [stop_process(process) for process in started]
    assert codes == [0] * SHARDS, f"psserver exit codes after SIGTERM: {codes}"


def _status(address: str) -> ps_pb2.StatusResponse:
    with grpc.insecure_channel(address) as channel:
        return ps_pb2_grpc.ParameterServerStub(channel).Status(ps_pb2.StatusRequest(), timeout=10)


def _train(tmp_path: Path, shards: list[str], config_text: str) -> dict[str, Any]:
    """``psworker train --task gpt2-small`` with this configuration file; its "done" record."""
    config = tmp_path / "worker.toml"
    config.write_text(config_text)
    log = tmp_path / "worker.jsonl"
    argv = ["train", "--task", "gpt2-small", "--config", str(config), "--log-file", str(log)]
    for address in shards:
        argv += ["--server", address]
    worker = start_program("psworker", argv, tmp_path / "worker.log")
    try:
        code = worker.wait(300)
    finally:
        stop_process(worker)
    assert code == 0, (tmp_path / "worker.log").read_text()
    line = next(line for line in log.read_text().splitlines() if '"event": "done"' in line)
    done: dict[str, Any] = json.loads(line)
    return done


def _balanced_at_the_clock(shards: list[str]) -> None:
    statuses = [_status(address) for address in shards]
    lengths = [status.shard_length for status in statuses]
    assert sum(lengths) == GPT2_SMALL_PARAMETERS
    assert max(lengths) / min(lengths) <= 1.01, lengths
    assert [status.clock for status in statuses] == [STEPS] * SHARDS


def test_a_few_cpu_steps_over_four_balanced_shards(tmp_path: Path, shards: list[str]) -> None:
    done = _train(tmp_path, shards, CPU_RUN)
    assert done["steps"] == STEPS and done["pushes"] == STEPS and done["device"] == "cpu"
    _balanced_at_the_clock(shards)
    # The four parts make the model again; on four validation windows (the whole set would take
    # minutes on a CPU) its loss is finite, near ln 50,257 ≈ 10.8 after two small steps.
    task = load_task("gpt2-small", options=TaskOptions(sequence_length=8))
    task = replace(task, test_inputs=task.test_inputs[:4], test_targets=task.test_targets[:4])
    evaluation = evaluate_servers(task, shards)
    assert math.isfinite(evaluation.loss) and evaluation.loss < 12, evaluation
    assert evaluation.clock == STEPS and evaluation.rejected == {}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_gpu_step_over_four_balanced_shards(tmp_path: Path, shards: list[str]) -> None:
    done = _train(tmp_path, shards, f'{RUN}device = "cuda"\n')
    assert done["steps"] == STEPS and str(done["device"]).startswith("cuda")
    _balanced_at_the_clock(shards)
    # The whole validation set (45 windows of 1,024 bytes), evaluated in chunks on the GPU.
    assert math.isfinite(done["test_loss"]) and done["test_loss"] < 12, done
