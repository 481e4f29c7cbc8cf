"""Asynchronous EASGD and EAMSGD — elastic averaging (Zhang, Choromanska & LeCun, 2015, "Deep
learning with Elastic Averaging SGD").

With the moving rate ``α = η ρ``, every ``λ`` local steps the worker pulls the centre ``x̃``,
computes the elastic difference ``E = α (x − x̃)``, moves itself ``x ← x − E`` and pushes ``E``.
The server adds it to the centre:

    x̃ ← x̃ + E

EAMSGD is the same with Nesterov momentum ``δ`` in the worker's local optimizer. The worker
never overwrites its own parameters with the centre; the server's parameters are the centre.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from psserver.core.rules._windowed import WindowedOptions, WindowedRule
from psserver.core.rules.base import PayloadKind, PushContext, Telemetry, register
from psserver.core.rules.options import RuleOptionError, option


@dataclass(frozen=True)
class EasgdOptions(WindowedOptions):
    lr: float = option(0.05, "learning rate of the worker's local steps", low=0.0, low_open=True)
    rho: float = option(5.0, "elasticity rho; the moving rate is alpha = lr * rho", low=0.0, low_open=True)
    window: int = option(32, "local steps lambda between elastic exchanges", low=1)
    local_momentum: float = option(
        0.0, "Nesterov momentum delta of the local optimizer, below 1 (> 0: EAMSGD)", low=0.0
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.local_momentum >= 1.0:
            raise RuleOptionError(f"option local_momentum={self.local_momentum} is out of range: 0 <= value < 1")
        if self.lr * self.rho > 1.0:
            raise RuleOptionError(
                f"the moving rate alpha = lr * rho = {self.lr * self.rho:g} must be at most 1 "
                "(beyond it a worker overshoots the centre); lower lr or rho"
            )


@register
class Easgd(WindowedRule[EasgdOptions]):
    name = "easgd"
    summary = "workers explore locally, tied to a centre by an elastic force; few exchanges, good at high latency"
    options_type = EasgdOptions
    accepted_kinds: ClassVar[frozenset[PayloadKind]] = frozenset({PayloadKind.DELTA})
    worker_procedure = "easgd"

    def apply(self, params: torch.Tensor, update: torch.Tensor, ctx: PushContext) -> Telemetry:
        params.add_(update)
        return {"scale": 1.0}

    def procedure_options(self) -> dict[str, str]:
        return self.options.procedure_strings()


@dataclass(frozen=True)
class EamsgdOptions(EasgdOptions):
    local_momentum: float = option(0.9, "Nesterov momentum delta of the local optimizer, below 1", low=0.0)


@register
class Eamsgd(Easgd):
    name = "eamsgd"
    summary = "EASGD with Nesterov momentum in each worker's local steps; the paper's best variant"
    options_type = EamsgdOptions
