"""DynSGD (Jiang, Cui, Zhang & Yu, 2017, "Heterogeneity-aware Distributed Parameter Servers"),
in the form the AGN authors' code uses.

Worker as windowed DOWNPOUR (``λ`` local steps, push ``Δ = θ_end − θ_start``). Server, with
``τ`` read when the push is applied:

    θ ← θ + Δ / (τ + 1)              (delta push)
    θ ← θ − η g / (τ + 1)            (gradient push, the λ = 1 form)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from psserver.core.rules._windowed import WindowedOptions, WindowedRule
from psserver.core.rules.base import PayloadKind, PushContext, Telemetry, register
from psserver.core.rules.options import option


@dataclass(frozen=True)
class DynSgdOptions(WindowedOptions):
    lr: float = option(
        0.05,
        "learning rate of the worker's local SGD steps (of the server for gradient pushes)",
        low=0.0,
        low_open=True,
    )
    window: int = option(5, "local steps lambda between pushes", low=1)


@register
class DynSgd(WindowedRule[DynSgdOptions]):
    name = "dynsgd"
    summary = "windowed DOWNPOUR with each delta divided by its staleness + 1; heterogeneous workers with local steps"
    options_type = DynSgdOptions
    accepted_kinds: ClassVar[frozenset[PayloadKind]] = frozenset({PayloadKind.GRADIENT, PayloadKind.DELTA})
    worker_procedure = "delta"
    spannable = True

    def apply(self, params: torch.Tensor, update: torch.Tensor, ctx: PushContext) -> Telemetry:
        scale = 1.0 / (ctx.staleness + 1)
        step = scale if ctx.kind is PayloadKind.DELTA else -self.options.lr * scale
        params.add_(update, alpha=step)
        return {"scale": scale}

    def procedure_options(self) -> dict[str, str]:
        return self.options.procedure_strings()
