"""ASGD / DOWNPOUR (Dean et al., 2012, "Large Scale Distributed Deep Networks").

Gradient push:  θ ← θ − η g.   Delta push (windowed DOWNPOUR):  θ ← θ + Δ.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from psserver.core.rules.base import PayloadKind, PushContext, Telemetry, UpdateRule, register
from psserver.core.rules.options import RuleOptions


@dataclass(frozen=True)
class AsgdOptions(RuleOptions):
    pass


@register
class Asgd(UpdateRule[AsgdOptions]):
    name = "asgd"
    summary = "plain asynchronous SGD: the baseline every staleness-aware rule is compared with"
    options_type = AsgdOptions
    accepted_kinds: ClassVar[frozenset[PayloadKind]] = frozenset({PayloadKind.GRADIENT, PayloadKind.DELTA})
    spannable = True

    def apply(self, params: torch.Tensor, update: torch.Tensor, ctx: PushContext) -> Telemetry:
        if ctx.kind is PayloadKind.DELTA:
            params.add_(update)
        else:
            params.add_(update, alpha=-self.options.lr)
        return {"scale": 1.0}
