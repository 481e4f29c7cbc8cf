"""Windowed DOWNPOUR (Dean et al., 2012, "Large Scale Distributed Deep Networks").

Worker: ``λ`` local SGD steps from the pulled parameters, then push ``Δ = θ_end − θ_start``
(not divided by ``λ``). Server:

    θ ← θ + Δ

``lr`` is the worker's local learning rate: the server applies the delta as it comes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from psserver.core.rules._windowed import WindowedOptions, WindowedRule
from psserver.core.rules.base import PayloadKind, PushContext, Telemetry, register
from psserver.core.rules.options import option


@dataclass(frozen=True)
class DownpourOptions(WindowedOptions):
    lr: float = option(0.05, "learning rate of the worker's local SGD steps", low=0.0, low_open=True)
    window: int = option(5, "local steps lambda between pushes", low=1)


@register
class Downpour(WindowedRule[DownpourOptions]):
    name = "downpour"
    summary = "workers take lambda local steps and push the delta; cuts traffic when the network, not compute, limits"
    options_type = DownpourOptions
    accepted_kinds: ClassVar[frozenset[PayloadKind]] = frozenset({PayloadKind.DELTA})
    worker_procedure = "delta"

    def apply(self, params: torch.Tensor, update: torch.Tensor, ctx: PushContext) -> Telemetry:
        params.add_(update)
        return {"scale": 1.0}

    def procedure_options(self) -> dict[str, str]:
        return self.options.procedure_strings()
