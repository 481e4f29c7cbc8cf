"""AB — Adaptive Braking (Venigalla et al., 2020, "Adaptive Braking for
Mitigating Gradient Delay").

Reconstructed from the papers' abstracts and related code; see the note in docs/rules.md.
On top of momentum SGD, a gradient is scaled by its alignment with the server's velocity
``v`` (weight decay is added to ``g`` first):

    c  = <g, v> / (‖g‖ ‖v‖ + 1e-12)      per model tensor (or over the whole shard); 0 when v = 0 or g = 0
    g̃  = (1 − α c) g                      (1 + α c with flip_sign, the opposite sign for ablations)
    v  ← μ v + g̃ ;  θ ← θ − η v

A stale gradient that points along the velocity is braked, one that opposes it is boosted.
``α = 0`` is naive momentum ASGD.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from psserver.core.rules._kernels import momentum_step
from psserver.core.rules.base import PushContext, Telemetry, UpdateRule, register
from psserver.core.rules.options import RuleOptions, option

# Keeps the cosine finite when a norm is zero; the numerator is then zero too, so c = 0.
_COSINE_EPSILON = 1e-12


@dataclass(frozen=True)
class AdaptiveBrakingOptions(RuleOptions):
    alpha: float = option(1.0, "braking strength; 0 is plain momentum ASGD", low=0.0, high=2.0)
    momentum: float = option(0.9, "momentum mu", low=0.0, high=1.0)
    granularity: str = option(
        "per_tensor", "cosine per model tensor or over the whole shard", choices=("per_tensor", "global")
    )
    weight_decay: float = option(0.0, "L2 weight decay, added to the gradient before the cosine", low=0.0)
    flip_sign: bool = option(False, "scale by 1 + alpha c instead of 1 - alpha c (ablation)")


@register
class AdaptiveBraking(UpdateRule[AdaptiveBrakingOptions]):
    name = "adaptive-braking"
    summary = "momentum ASGD that brakes gradients aligned with the velocity; keeps momentum usable at large delays"
    options_type = AdaptiveBrakingOptions

    def __init__(self, options: AdaptiveBrakingOptions, length: int) -> None:
        super().__init__(options, length)
        self.velocity = torch.zeros(length)

    def apply(self, params: torch.Tensor, update: torch.Tensor, ctx: PushContext) -> Telemetry:
        opts = self.options
        if opts.granularity == "global" or not ctx.segments:
            spans = [(params, update, self.velocity)]
        else:
            lengths = [end - start for start, end in ctx.segments]
            spans = list(
                zip(
                    torch.split(params, lengths),
                    torch.split(update, lengths),
                    torch.split(self.velocity, lengths),
                    strict=True,
                )
            )
        factors, cosines = [], []
        # Tensor by tensor, the step right after the cosine, so a tensor's gradient and velocity
        # are often still cached when the fused kernel reads them again; g̃ = (1 ∓ α c) g enters
        # the velocity through the kernel's gradient scale.
        for p, g, v in spans:
            if not g.numel():
                continue
            if opts.weight_decay:
                g.add_(p, alpha=opts.weight_decay)
            factor, cosine = self._factor(g, v)
            momentum_step(p, v, g, momentum=opts.momentum, lr=opts.lr, gradient_scale=factor)
            factors.append(factor)
            cosines.append(cosine)
        if not factors:
            return {"scale": 1.0, "cosine": 0.0, "cosine_min": 0.0, "cosine_max": 0.0}
        return {
            "scale": sum(factors) / len(factors),
            "cosine": sum(cosines) / len(cosines),
            "cosine_min": min(cosines),
            "cosine_max": max(cosines),
        }

    def _factor(self, g: torch.Tensor, v: torch.Tensor) -> tuple[float, float]:
        """The scale ``1 ∓ α c`` and the cosine ``c`` of one (gradient, velocity) span."""
        # Three BLAS dot products per tensor: measured several times faster than a segment-id
        # reduction over the shard, and faster than dot products per cache block.
        dot, g_square, v_square = torch.stack((g @ v, g @ g, v @ v)).tolist()
        if g_square == 0 or v_square == 0:
            cosine = 0.0
        else:
            cosine = dot / (math.sqrt(g_square) * math.sqrt(v_square) + _COSINE_EPSILON)
        alpha = self.options.alpha
        return (1.0 + alpha * cosine if self.options.flip_sign else 1.0 - alpha * cosine), cosine

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"velocity": self.velocity}
