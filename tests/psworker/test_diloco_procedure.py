"""The diloco procedure: H steps of the task's own optimizer, push θ_end − θ_start, keep the optimizer.

Runs against a real in-process shard (``tests.psserver.core.rules.conftest.Cluster``) on
``nn.Linear(2, 2)`` with gradients set by hand, beside a reference optimizer stepped alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pytest
import torch
from torch import nn

from pstools.sim_tasks import digits_mlp
from pstools.simulate import SimConfig, Simulation
from psworker.binding import ModelBinding
from psworker.procedure_options import DilocoOptions, ProcedureError
from psworker.procedures import DilocoProcedure, build_procedure
from psworker.service import PushResult
from tests.psserver.core.rules.conftest import INITIAL, Cluster

GRADIENTS = [
    torch.tensor([1.0, 2.0, -1.0, 0.5, 0.0, 4.0]),
    torch.tensor([-3.0, 1.0, 2.0, 2.0, 1.0, -1.0]),
    torch.tensor([0.5, -0.5, 1.0, 0.0, -2.0, 1.0]),
    torch.tensor([2.0, 0.0, -1.0, 1.0, 1.0, 0.5]),
]


def _sgd_momentum(parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    return torch.optim.SGD(parameters, lr=0.1, momentum=0.9)


def _set_gradient(model: nn.Module, gradient: torch.Tensor) -> None:
    offset = 0
    for parameter in model.parameters():
        count = parameter.numel()
        parameter.grad = gradient[offset : offset + count].reshape(parameter.shape).clone()
        offset += count


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _load(model: nn.Module, flat: torch.Tensor) -> None:
    offset = 0
    with torch.no_grad():
        for parameter in model.parameters():
            count = parameter.numel()
            parameter.copy_(flat[offset : offset + count].reshape(parameter.shape))
            offset += count


def test_pushes_the_window_delta_and_keeps_the_optimizer_state_across_rounds() -> None:
    # ε = 0.5, μ = 0: the server moves half the delta, so the worker's next round starts from
    # parameters it did not reach itself; only its optimizer state carries over.
    cluster = Cluster("diloco", lr="0.5", momentum="0", window="2")
    model = nn.Linear(2, 2)
    client = cluster.service("a")
    pushed: list[tuple[torch.Tensor, int, Mapping[str, float]]] = []
    push = client.push

    def recording_push(values: torch.Tensor, kind: int, *args: Any, **kwargs: Any) -> list[PushResult]:
        metadata = args[0] if args else kwargs.get("metadata", {})
        pushed.append((values.clone(), kind, dict(metadata or {})))
        return push(values, kind, *args, **kwargs)

    client.push = recording_push  # type: ignore[method-assign]
    procedure = build_procedure(client, ModelBinding(model), _sgd_momentum)
    assert isinstance(procedure, DilocoProcedure)
    procedure.start()

    reference = nn.Linear(2, 2)
    _load(reference, INITIAL)
    reference_optimizer = _sgd_momentum(reference.parameters())
    theta = INITIAL.clone()
    for round_gradients in (GRADIENTS[:2], GRADIENTS[2:]):
        start = _flat(reference).clone()
        for gradient in round_gradients:
            _set_gradient(model, gradient)
            assert procedure.step(0.0).pushed == (gradient is round_gradients[-1])
            _set_gradient(reference, gradient)
            reference_optimizer.step()
        delta = _flat(reference) - start
        values, kind, metadata = pushed[-1]
        torch.testing.assert_close(values, delta)  # θ_end − θ_start, not divided by H
        assert kind == 2 and metadata == {"steps_done": 2.0}  # PAYLOAD_KIND_DELTA
        theta = theta + 0.5 * delta
        torch.testing.assert_close(cluster.params, theta)
        torch.testing.assert_close(_flat(model), theta)  # the worker took the server's parameters
        _load(reference, theta)  # the reference starts the next round there too, momentum kept

    assert len(pushed) == 2 and all(values.numel() == INITIAL.numel() for values, _, _ in pushed)
    assert isinstance(procedure.optimizer, torch.optim.SGD)
    buffers = [procedure.optimizer.state[p]["momentum_buffer"] for p in model.parameters()]
    assert torch.cat([b.reshape(-1) for b in buffers]).abs().sum() > 0


def test_without_a_task_optimizer_the_local_steps_are_sgd_at_local_lr() -> None:
    cluster = Cluster("diloco-dn", window="3", local_lr="0.25")
    procedure = build_procedure(cluster.service("a"), ModelBinding(nn.Linear(2, 2)))
    assert isinstance(procedure, DilocoProcedure) and procedure.window == 3
    assert isinstance(procedure.optimizer, torch.optim.SGD)
    assert procedure.optimizer.param_groups[0]["lr"] == 0.25
    assert not procedure.optimizer.param_groups[0]["momentum"]


def test_options_out_of_range_are_refused() -> None:
    with pytest.raises(ProcedureError, match="window must be >= 1"):
        DilocoOptions(local_lr=0.1, window=0).local_steps()
    with pytest.raises(ProcedureError, match="local_lr must be > 0"):
        DilocoOptions(local_lr=0.0, window=2).local_steps()


def test_the_simulator_gives_the_procedure_the_tasks_optimizer() -> None:
    task = digits_mlp()
    task.build_optimizer = lambda parameters: torch.optim.AdamW(parameters, lr=1e-3)
    simulation = Simulation(SimConfig(rule="diloco", workers=2, task="digits-mlp", steps=4), task=task)
    optimizers = [getattr(worker.procedure, "optimizer", None) for worker in simulation.workers]
    assert all(isinstance(optimizer, torch.optim.AdamW) for optimizer in optimizers)
    assert optimizers[0] is not optimizers[1]
