"""The diloco procedure through the optimizer wrapper, against a shard served over gRPC."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psserver.rpc.server import start_server
from psworker.optim import ParameterServerOptimizer
from psworker.procedures import DilocoProcedure
from tests.psworker.test_diloco_procedure import GRADIENTS, _flat, _set_gradient


def test_the_optimizer_wrapper_runs_the_models_own_optimizer_over_grpc() -> None:
    shard = Shard(ShardConfig(RuleSpec.parse("diloco", {"lr": "1", "momentum": "0", "window": "2"})))
    running = start_server(shard, "127.0.0.1:0")
    try:
        model = nn.Linear(2, 2)
        start = _flat(model).clone()

        def adamw(parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
            return torch.optim.AdamW(parameters, lr=0.01)

        with ParameterServerOptimizer(model, f"127.0.0.1:{running.port}", build_optimizer=adamw) as opt:
            for gradient in GRADIENTS[:2]:
                _set_gradient(model, gradient)
                opt.step()
            assert isinstance(opt.procedure, DilocoProcedure)
            assert isinstance(opt.procedure.optimizer, torch.optim.AdamW)
            assert all(state["step"] == 2 for state in opt.procedure.optimizer.state.values())
        assert shard.clock == 1  # one push for the window of two
        torch.testing.assert_close(shard.params, _flat(model))  # ε = 1, μ = 0: the worker's own end point
        assert not torch.equal(shard.params, start)
    finally:
        running.stop(0)
