"""Naive momentum ASGD (textbook heavy-ball momentum applied per arrival).

    v ← μ v + g ;   θ ← θ − η v

The baseline that OrMo, Adaptive Braking and Gap-Aware improve on.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from psserver.core.rules._kernels import momentum_step
from psserver.core.rules.base import PushContext, Telemetry, UpdateRule, register
from psserver.core.rules.options import RuleOptions, option


@dataclass(frozen=True)
class MomentumOptions(RuleOptions):
    momentum: float = option(0.9, "momentum mu", low=0.0, high=1.0)


@register
class Momentum(UpdateRule[MomentumOptions]):
    name = "momentum"
    summary = "asynchronous SGD with server-side momentum; fast on near-homogeneous clusters, hurt by staleness"
    options_type = MomentumOptions

    def __init__(self, options: MomentumOptions, length: int) -> None:
        super().__init__(options, length)
        self.velocity = torch.zeros(length)

    def apply(self, params: torch.Tensor, update: torch.Tensor, ctx: PushContext) -> Telemetry:
        # One pass through torch's fused SGD kernel (dampening 0), op by op where it cannot run.
        momentum_step(params, self.velocity, update, momentum=self.options.momentum, lr=self.options.lr)
        return {"scale": 1.0}

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"velocity": self.velocity}
