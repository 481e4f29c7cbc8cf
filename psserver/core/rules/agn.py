"""AGN — Accumulated Gradient Normalization (Hermans et al., 2017, "Accumulated
Gradient Normalization").

Worker: pull ``θ̃``; take ``λ`` local optimizer steps accumulating ``a = Σ Δ_i``; push the
normalised ``a / λ`` (a final partial window divides by the steps it did); pull and overwrite
the local model. Local optimizer state persists across windows. Server, with no staleness term:

    θ̃ ← θ̃ + a

``λ = 1`` is DOWNPOUR. The paper's heuristic is ``λ ≈ (n + number of layers) / 2``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from psserver.core.rules._windowed import WindowedOptions, WindowedRule
from psserver.core.rules.base import PayloadKind, PushContext, Telemetry, register
from psserver.core.rules.options import option


@dataclass(frozen=True)
class AgnOptions(WindowedOptions):
    lr: float = option(0.001, "learning rate of the worker's local optimizer", low=0.0, low_open=True)
    window: int = option(12, "local steps lambda per push", low=1)
    local_optimizer: str = option("adam", "the worker's local optimizer (the paper uses Adam)", choices=("sgd", "adam"))


@register
class Agn(WindowedRule[AgnOptions]):
    name = "agn"
    summary = "workers push their window's delta divided by its length; many workers, where DOWNPOUR diverges"
    options_type = AgnOptions
    accepted_kinds: ClassVar[frozenset[PayloadKind]] = frozenset({PayloadKind.DELTA})
    worker_procedure = "agn"

    def apply(self, params: torch.Tensor, update: torch.Tensor, ctx: PushContext) -> Telemetry:
        params.add_(update)
        return {"scale": 1.0}

    def procedure_options(self) -> dict[str, str]:
        return self.options.procedure_strings()
