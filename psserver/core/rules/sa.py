"""SA — staleness-aware learning rate (Zhang, Gupta, Lian & Liu, 2016, "Staleness-aware Async-SGD
for Distributed Deep Learning").

    θ ← θ − (η / max(τ, 1)) g          (offset=0, the paper's modulation)
    θ ← θ − (η / (τ + 1)) g            (offset=1)

A push that is ``τ`` updates old moves the model ``τ`` times less, so a slow worker's gradient
weighs like one averaged over the fast workers' steps it missed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from psserver.core.rules.base import PushContext, Telemetry, UpdateRule, register
from psserver.core.rules.options import RuleOptions, option


@dataclass(frozen=True)
class SaOptions(RuleOptions):
    offset: int = option(0, "0: divide eta by max(tau, 1); 1: divide it by tau + 1", low=0, high=1)


@register
class StalenessAware(UpdateRule[SaOptions]):
    name = "sa"
    summary = "asynchronous SGD with eta divided by the staleness; a simple, robust choice when workers differ in speed"
    options_type = SaOptions
    spannable = True

    def apply(self, params: torch.Tensor, update: torch.Tensor, ctx: PushContext) -> Telemetry:
        scale = 1.0 / (ctx.staleness + 1 if self.options.offset else max(ctx.staleness, 1))
        params.add_(update, alpha=-self.options.lr * scale)
        return {"scale": scale}
