"""InProcessService: the ParameterService over a core shard in this process, as workers use it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from psproto import codec
from psproto.layout import Layout
from psproto.v1 import ps_pb2
from psserver.core.errors import ErrorKind, ShardError
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from pstools.inprocess import InProcessService
from pstools.simulate import SimConfig, SimulationError, simulate
from psworker.binding import ModelBinding
from psworker.procedures import GemProcedure, GradientProcedure
from psworker.push_encoding import PushEncoder
from psworker.service import ParameterService
from psworker.startup import start_worker

LAYOUT = Layout.from_named_shapes([("w", (4,))])


def _shard(rule: str = "asgd", **options: str) -> Shard:
    return Shard(ShardConfig(RuleSpec.parse(rule, {"lr": "0.5", **options})))


def test_it_is_a_parameter_service() -> None:
    service: ParameterService = InProcessService(_shard(), LAYOUT, "typed")  # checked by mypy too
    assert service.name == "typed"
    assert service.rule.name == "asgd" and service.rule.worker_procedure == "gradient"
    assert not service.initialized


def test_init_pull_push_heartbeat_leave_go_through_the_shard() -> None:
    shard = _shard()
    service = InProcessService(shard, LAYOUT, "w", chunk_bytes=8)  # two chunks of two floats
    assert service.init(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert service.initialized
    assert not InProcessService(shard, LAYOUT, "late").init(torch.zeros(4))  # the first Init wins
    out = torch.empty(4)
    assert service.pull(out) == 0
    torch.testing.assert_close(out, torch.tensor([1.0, 2.0, 3.0, 4.0]))
    back = torch.empty(4)
    (result,) = service.push(torch.ones(4), ps_pb2.PAYLOAD_KIND_GRADIENT, pull_into=back)
    assert (result.clock, result.staleness, result.duplicate) == (1, 0, False)
    torch.testing.assert_close(back, torch.tensor([0.5, 1.5, 2.5, 3.5]))
    assert service.clock == 1
    service.heartbeat({"compute_seconds": 0.1})
    assert shard.workers[service.worker_id].stats == {"compute_seconds": 0.1}
    service.leave()
    assert service.worker_id not in shard.workers


def test_a_refusal_is_the_shards_own_error() -> None:
    service = InProcessService(_shard(), LAYOUT, "w")
    service.init(torch.zeros(4))
    with pytest.raises(ShardError) as refused:
        service.push(torch.tensor([0.0, float("nan"), 0.0, 0.0]))
    assert refused.value.kind is ErrorKind.NON_FINITE


def test_a_held_pull_parks_the_worker() -> None:
    held: list[int] = []
    service = InProcessService(_shard(), LAYOUT, "w", hold_pull=lambda worker_id: not held.append(worker_id))
    assert service.pull(torch.empty(4)) == service.clock
    assert service.parked and held == [service.worker_id]


class Tiny(nn.Module):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.full((4,), value))


def test_start_up_inits_once_and_starts_the_procedure_the_rule_names() -> None:
    shard = _shard()
    first, second = Tiny(1.0), Tiny(7.0)
    inits: list[bool] = []
    procedure = start_worker(InProcessService(shard, LAYOUT, "a"), ModelBinding(first), on_init=inits.append)
    assert isinstance(procedure, GradientProcedure) and inits == [True]
    start_worker(InProcessService(shard, LAYOUT, "b"), ModelBinding(second), on_init=inits.append)
    assert inits == [True]  # already initialised: no second Init
    # Both workers start from the server's parameters: the first worker's model.
    torch.testing.assert_close(second.w.detach(), torch.ones(4))


def test_gem_runs_atomically_over_the_service() -> None:
    shard = _shard("gem", lr="0.05", kappa="2.0")
    model = Tiny(0.0)
    procedure = start_worker(InProcessService(shard, LAYOUT, "g"), ModelBinding(model))
    assert isinstance(procedure, GemProcedure) and procedure.atomic
    model.w.sum().backward()  # type: ignore[no-untyped-call]
    outcome = procedure.step(0.0)
    assert outcome.pushed and shard.clock == 1
    torch.testing.assert_close(shard.params, torch.full((4,), 2.0 * -0.05))


def test_int8_pushes_are_decoded_by_the_shard_as_from_the_wire() -> None:
    service = InProcessService(_shard(), LAYOUT, "int8", push_encoder=PushEncoder(codec.INT8_BLOCK))
    assert service.init(torch.zeros(4))
    out = torch.empty(4)
    gradient = torch.tensor([1.0, 0.003, -0.5, 0.0])
    for step in range(1, 4):
        service.pull(out)
        service.push(gradient)
        # The shard applied Σx̂ = Σp − e (error feedback): θ = −lr · (step · p − e).
        residual = service._push_encoder.residual(0) if service._push_encoder else None
        assert residual is not None and bool(residual.abs().max() > 0)
        service.pull(out)
        torch.testing.assert_close(out, -0.5 * (step * gradient - residual), atol=1e-6, rtol=0)


def test_without_error_feedback_each_int8_push_is_applied_as_quantised_on_its_own() -> None:
    service = InProcessService(
        _shard(), LAYOUT, "int8", push_encoder=PushEncoder(codec.INT8_BLOCK, error_feedback=False)
    )
    assert service.init(torch.zeros(4))
    out = torch.empty(4)
    gradient = torch.tensor([1.0, 0.003, -0.5, 0.0])
    # One block: scale 1/127, so 0.003 rounds to 0 (0.381 of a step) every time; nothing carries over.
    quantised = torch.tensor([1.0, 0.0, -64 / 127, 0.0])
    for step in range(1, 4):
        service.push(gradient)
        assert service._push_encoder is not None and service._push_encoder.residual(0) is None
        service.pull(out)
        torch.testing.assert_close(out, -0.5 * step * quantised, atol=1e-6, rtol=0)


def test_the_simulator_refuses_an_unknown_push_dtype() -> None:
    with pytest.raises(SimulationError, match="push dtype 'int4'"):
        simulate(SimConfig(push_dtype="int4", steps=1))
