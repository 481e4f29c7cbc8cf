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

from psserver.core.rules import _kernels
from psserver.core.rules._kernels import split
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
        # Scratch for one cache block: the whole push runs a block at a time while it is cached.
        self._work = torch.empty(min(length, _kernels.BLOCK))
        self._distance = torch.empty(min(length, _kernels.BLOCK))
        self._inverse_rms = torch.empty(min(length, _kernels.BLOCK) if self.adaptive else 0)

    def apply(self, params: torch.Tensor, update: torch.Tensor, ctx: PushContext) -> Telemetry:
        telemetry: Telemetry = {"gap": 0.0}
        backup = None
        if ctx.staleness > 0:
            backup = ctx.snapshot()
            if backup is None:
                # An unknown gap is not a zero gap: leave it out of the gap statistics.
                telemetry = {"snapshot_missing": 1.0}
        blocks = split(params)
        none: list[torch.Tensor | None] = [None] * len(blocks)
        squares = split(self.mean_square) if self.adaptive else none
        backups = split(backup) if backup is not None else none
        gap_sums = []
        for p, g, ms, b in zip(blocks, split(update), squares, backups, strict=True):
            if ms is not None:
                m = self.options.ms_momentum
                ms.mul_(m).addcmul_(g, g, value=1.0 - m)
            if b is not None:
                gap_sums.append(self._compensate(p, g, b, ms))
            p.add_(g, alpha=-self.options.lr)
        if gap_sums:
            telemetry["gap"] = float(torch.stack(gap_sums).double().sum()) / max(self.length, 1)
        return telemetry

    def _compensate(
        self, params: torch.Tensor, update: torch.Tensor, backup: torch.Tensor, mean_square: torch.Tensor | None
    ) -> torch.Tensor:
        """Add ``λ g ⊙ g ⊙ (θ − θ_bak)`` to one block of ``update`` in place; returns its ``Σ |θ − θ_bak|``."""
        opts = self.options
        count = params.numel()
        drift = torch.sub(params, backup, out=self._work[:count])
        # |drift| summed, not vector_norm(ord=1): measured five times faster.
        gap = torch.abs(drift, out=self._distance[:count]).sum()
        drift.mul_(update)
        if mean_square is not None:
            inverse_rms = torch.add(mean_square, opts.epsilon, out=self._inverse_rms[:count]).rsqrt_()
            drift.mul_(inverse_rms)
            update.addcmul_(drift, update, value=opts.lambda0)
        else:
            update.addcmul_(drift, update, value=opts.lambda_dc)
        return gap

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"mean_square": self.mean_square} if self.adaptive else {}
