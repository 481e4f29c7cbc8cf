"""DC-ASGD — delay-compensated ASGD (Zheng et al., 2017, "Asynchronous Stochastic Gradient
Descent with Delay Compensation").

The server keeps, per worker, the parameters it pulled, ``θ_bak(w) = θ_{b_w}``, and corrects
the stale gradient with a cheap diagonal approximation of the Hessian, ``λ g ⊙ g``:

    constant:  θ ← θ − η (g + λ_dc g ⊙ g ⊙ (θ − θ_bak(w)))
    adaptive:  MS ← m MS + (1 − m) g ⊙ g ;  λ_t = λ0 ⊘ sqrt(MS + ε)
               θ ← θ − η (g + λ_t ⊙ g ⊙ g ⊙ (θ − θ_bak(w)))

The backup is per worker (the paper's meaning), served by the shard's snapshot store. When
the push is fresh (``τ = 0``) the gap is zero and no snapshot is read. When a stale push's
snapshot is gone (dropped for memory), the gap is taken as zero: the push is applied as
plain ASGD and the telemetry says ``snapshot_missing``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from psserver.core.rules.base import PushContext, Telemetry, UpdateRule, register
from psserver.core.rules.options import RuleOptionError, RuleOptions, option


@dataclass(frozen=True)
class DcAsgdOptions(RuleOptions):
    variant: str = option(
        "constant", "constant: a fixed lambda_dc; adaptive: lambda0 / sqrt(MS)", choices=("constant", "adaptive")
    )
    lambda_dc: float = option(0.04, "compensation strength of the constant variant", low=0.0)
    lambda0: float = option(2.0, "compensation strength of the adaptive variant", low=0.0)
    ms_momentum: float = option(0.95, "decay m of the mean square of gradients (adaptive), below 1", low=0.0)
    epsilon: float = option(1e-7, "added to MS before the square root (adaptive)", low=0.0, low_open=True)

    def __post_init__(self) -> None:
        if self.ms_momentum >= 1.0:
            raise RuleOptionError(f"option ms_momentum={self.ms_momentum} is out of range: 0 <= value < 1")


@register
class DcAsgd(UpdateRule[DcAsgdOptions]):
    name = "dc-asgd"
    summary = "ASGD with a first-order correction for the model's drift; moderate staleness, memory for snapshots"
    options_type = DcAsgdOptions
    needs_snapshot = True

    def __init__(self, options: DcAsgdOptions, length: int) -> None:
        super().__init__(options, length)
        self.adaptive = options.variant == "adaptive"
        self.mean_square = torch.zeros(length if self.adaptive else 0)
        self._work = torch.empty(length)
        self._inverse_rms = torch.empty(length if self.adaptive else 0)

    def apply(self, params: torch.Tensor, update: torch.Tensor, ctx: PushContext) -> Telemetry:
        opts = self.options
        if self.adaptive:
            m = opts.ms_momentum
            self.mean_square.mul_(m).addcmul_(update, update, value=1.0 - m)
        telemetry: Telemetry = {"gap": 0.0}
        if ctx.staleness > 0:
            backup = ctx.snapshot()
            if backup is None:
                # An unknown gap is not a zero gap: leave it out of the gap statistics.
                telemetry = {"snapshot_missing": 1.0}
            else:
                telemetry["gap"] = self._compensate(params, update, backup)
        params.add_(update, alpha=-opts.lr)
        return telemetry

    def _compensate(self, params: torch.Tensor, update: torch.Tensor, backup: torch.Tensor) -> float:
        """Add ``λ g ⊙ g ⊙ (θ − θ_bak)`` to ``update`` in place; returns the mean ``|θ − θ_bak|``."""
        opts = self.options
        drift = torch.sub(params, backup, out=self._work)
        gap = float(torch.linalg.vector_norm(drift, ord=1)) / max(self.length, 1)
        drift.mul_(update).mul_(update)
        if self.adaptive:
            inverse_rms = torch.add(self.mean_square, opts.epsilon, out=self._inverse_rms).rsqrt_()
            update.addcmul_(drift, inverse_rms, value=opts.lambda0)
        else:
            update.add_(drift, alpha=opts.lambda_dc)
        return gap

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"mean_square": self.mean_square} if self.adaptive else {}
