"""GEM — Gradient Energy Matching (Hermans & Louppe, 2018, "Gradient Energy Matching for
Distributed Asynchronous Gradient Descent").

Everything element-wise happens on the worker: with ``s`` the parameters its gradient was
computed on, ``Δ = −η ∇L(s)``, the proxy momentum ``m ← μ m + Δ`` and the current centre ``θ``,

    π = clamp((κ |m| − |θ − s|) ⊘ (|Δ| + ε), 0, π_max)

and it pushes ``π ⊙ Δ`` so that the centre's momentum energy matches the proxy's. The server
adds the delta:

    θ ← θ + π ⊙ Δ

``atomic`` makes the worker pull and commit with no other commit in between (the reference's
behaviour, through a reserved pull); ``local_apply`` adds the worker's own ``π ⊙ Δ`` to its
copy before the next gradient. The worker sends the median of ``π``, reported as ``scale``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from psserver.core.rules.base import PayloadKind, PushContext, Telemetry, UpdateRule, register
from psserver.core.rules.options import RuleOptionError, RuleOptions, option


@dataclass(frozen=True)
class GemOptions(RuleOptions):
    lr: float = option(0.05, "learning rate of the worker's step delta = -lr grad", low=0.0, low_open=True)
    momentum: float = option(0.9, "momentum mu of the proxy, below 1", low=0.0)
    kappa: float = option(1.0, "energy ratio kappa (2 also works; 4 starts to diverge)", low=0.0, low_open=True)
    pi_max: float = option(5.0, "largest scale pi of a gradient element", low=0.0, low_open=True)
    epsilon: float = option(1e-12, "added to |delta| in the division", low=0.0, low_open=True)
    local_apply: bool = option(True, "the worker adds its own pushed delta to its copy")
    atomic: bool = option(True, "pull then push with no other commit in between (slower, as the reference)")

    def __post_init__(self) -> None:
        if self.momentum >= 1.0:
            raise RuleOptionError(f"option momentum={self.momentum} is out of range: 0 <= value < 1")


@register
class Gem(UpdateRule[GemOptions]):
    name = "gem"
    summary = "workers scale their steps to match the momentum energy of sequential SGD; stable as workers grow"
    options_type = GemOptions
    accepted_kinds: ClassVar[frozenset[PayloadKind]] = frozenset({PayloadKind.DELTA})
    worker_procedure = "gem"

    def apply(self, params: torch.Tensor, update: torch.Tensor, ctx: PushContext) -> Telemetry:
        params.add_(update)
        pi_median = ctx.metadata.get("pi_median")
        return {} if pi_median is None else {"scale": float(pi_median)}

    def procedure_options(self) -> dict[str, str]:
        return self.options.as_strings()

    @property
    def reserves_pulls(self) -> bool:
        return self.options.atomic
