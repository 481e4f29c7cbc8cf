"""Worker procedures against a real gRPC server in this process, with a linear loss whose gradient is known.

With ``L(w) = <c, w>`` every gradient is exactly ``c``, so every procedure's pushes can be
written down from its equations.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from torch import nn

from psproto.v1 import ps_pb2
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psserver.rpc.server import start_server
from psworker.binding import ModelBinding
from psworker.client import PSClient
from psworker.procedure_options import parse_options
from psworker.procedures import (
    AgnProcedure,
    EasgdProcedure,
    GemProcedure,
    GradientProcedure,
    Procedure,
    ProcedureError,
    WindowedDeltaProcedure,
    procedure_class,
)
from psworker.startup import start_worker

C = torch.tensor([1.0, -2.0, 0.5, 3.0])
W0 = torch.tensor([0.1, 0.2, -0.3, 0.4])


class Linear(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(W0.clone())

    def loss(self) -> torch.Tensor:
        return (self.w * C).sum()


@pytest.fixture
def server() -> Iterator[tuple[Shard, object]]:
    started: list[tuple[Shard, object]] = []

    def start(rule: str, **options: str) -> tuple[Shard, str]:
        shard = Shard(ShardConfig(RuleSpec.parse(rule, options)))
        running = start_server(shard, "127.0.0.1:0")
        started.append((shard, running))
        return shard, f"127.0.0.1:{running.port}"

    yield start  # type: ignore[misc]
    for _, running in started:
        running.stop(0)  # type: ignore[attr-defined]


def _worker(address: str, name: str = "w") -> tuple[Linear, PSClient, Procedure[Any]]:
    model = Linear()
    binding = ModelBinding(model)
    client = PSClient(address, binding.layout, name=name)
    procedure = start_worker(client, binding)
    return model, client, procedure


def _steps(model: Linear, procedure: Procedure[Any], count: int) -> list[object]:
    outcomes = []
    for _ in range(count):
        model.zero_grad()
        loss = model.loss()
        loss.backward()  # type: ignore[no-untyped-call]
        outcomes.append(procedure.step(float(loss.detach())))
    return outcomes


def test_the_join_reply_picks_the_procedure(server) -> None:  # type: ignore[no-untyped-def]
    expected = {
        "asgd": GradientProcedure,
        "downpour": WindowedDeltaProcedure,
        "agn": AgnProcedure,
        "easgd": EasgdProcedure,
        "gem": GemProcedure,
    }
    for rule, cls in expected.items():
        _, address = server(rule)
        _, client, procedure = _worker(address)
        assert type(procedure) is cls, rule
        client.close()


def test_downpour_window_1_is_asgd(server) -> None:  # type: ignore[no-untyped-def]
    asgd_shard, asgd = server("asgd", lr="0.1")
    downpour_shard, downpour = server("downpour", lr="0.1", window="1")
    for address in (asgd, downpour):
        model, client, procedure = _worker(address)
        _steps(model, procedure, 5)
        client.close()
    torch.testing.assert_close(downpour_shard.params, asgd_shard.params)
    torch.testing.assert_close(asgd_shard.params, W0 - 5 * 0.1 * C)
    assert asgd_shard.clock == downpour_shard.clock == 5


def test_agn_window_1_is_downpour(server) -> None:  # type: ignore[no-untyped-def]
    agn_shard, agn = server("agn", lr="0.1", window="1", local_optimizer="sgd")
    downpour_shard, downpour = server("downpour", lr="0.1", window="1")
    for address in (agn, downpour):
        model, client, procedure = _worker(address)
        _steps(model, procedure, 4)
        client.close()
    torch.testing.assert_close(agn_shard.params, downpour_shard.params)


def test_agn_normalises_every_window_and_the_final_partial_one(server) -> None:  # type: ignore[no-untyped-def]
    shard, address = server("agn", lr="0.1", window="3", local_optimizer="sgd")
    model, client, procedure = _worker(address)
    outcomes = _steps(model, procedure, 7)
    pushed = [o for o in outcomes if o.pushed]  # type: ignore[attr-defined]
    assert len(pushed) == 2 and shard.clock == 2
    # Each full window moves the model by -3·η·c locally and pushes that divided by 3.
    torch.testing.assert_close(shard.params, W0 - 2 * 0.1 * C)
    final = procedure.finish()  # one step done in the last window: pushes -η·c / 1
    assert final is not None and final.pushed
    torch.testing.assert_close(shard.params, W0 - 3 * 0.1 * C)
    assert procedure.finish() is None
    client.close()


def test_easgd_pushes_the_elastic_difference(server) -> None:  # type: ignore[no-untyped-def]
    lr, rho = 0.1, 2.0
    shard, address = server("easgd", lr=str(lr), rho=str(rho), window="2", local_momentum="0")
    model, client, procedure = _worker(address)
    _steps(model, procedure, 2)
    local = W0 - 2 * lr * C
    elastic = lr * rho * (local - W0)
    torch.testing.assert_close(shard.params, W0 + elastic)
    torch.testing.assert_close(model.w.detach(), local - elastic)
    client.close()


def test_gem_first_commit_scales_by_kappa(server) -> None:  # type: ignore[no-untyped-def]
    shard, address = server("gem", lr="0.05", kappa="2.0", momentum="0.9")
    model, client, procedure = _worker(address)
    (outcome,) = _steps(model, procedure, 1)
    delta = -0.05 * C
    torch.testing.assert_close(shard.params, W0 + 2.0 * delta)
    assert outcome.telemetry["pi_median"] == pytest.approx(2.0)  # type: ignore[attr-defined]
    # local_apply: the worker's copy is the centre it pulled plus its own commit.
    torch.testing.assert_close(model.w.detach(), W0 + 2.0 * delta)
    client.close()


def test_gem_pi_follows_the_energy_of_the_proxy(server) -> None:  # type: ignore[no-untyped-def]
    mu, lr, kappa = 0.5, 0.05, 1.0
    shard, address = server("gem", lr=str(lr), kappa=str(kappa), momentum=str(mu), pi_max="5")
    model, client, procedure = _worker(address)
    _steps(model, procedure, 2)
    delta = -lr * C
    # Step 2 alone: m = μΔ + Δ, θ = s (nobody else committed), so π = κ(1 + μ).
    torch.testing.assert_close(shard.params, W0 + kappa * delta + kappa * (1 + mu) * delta)
    client.close()


def test_an_unknown_procedure_is_refused_with_what_is_known() -> None:
    rule = ps_pb2.RuleInfo(name="future-rule", worker_procedure="quantum")
    with pytest.raises(ProcedureError, match=r"needs worker procedure 'quantum'.*it knows gradient, delta, agn"):
        procedure_class(rule)


def test_missing_procedure_options_are_named() -> None:
    rule = ps_pb2.RuleInfo(name="downpour", worker_procedure="delta", procedure_options={"lr": "0.1"})
    cls = procedure_class(rule)
    with pytest.raises(ProcedureError, match="needs option 'window'"):
        parse_options(cls.name, cls.options_type, rule.procedure_options)
