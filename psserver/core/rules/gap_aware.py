"""GA — Gap-Aware staleness mitigation (Barkai, Hakimi & Schuster, ICLR 2020, "Gap-Aware
Mitigation of Gradient Staleness").

Reconstructed from the papers' abstracts and related code (the authors' group's
implementation); see the note in docs/rules.md. With ``θ_{b_w}`` the parameters the worker
pulled and ``q`` the base optimizer's momentum buffer *as it was before this push* (or ``g``
itself without momentum):

    k ← k + 1
    v ← γ v + (1 − γ) q ⊙ q                    (EMA of squared steps)
    C = η_max (sqrt(v / (1 − γ^k)) + ε)          (the typical step size)
    G = 1 + |θ − θ_{b_w}| ⊘ C                    (the Gap, ≥ 1; G = 1 when τ = 0)
    g̃ = (g + wd θ) ⊘ G                           (weight decay is penalised too)
    SGD: θ ← θ − η g̃     momentum: buf ← μ buf + g̃ ;  θ ← θ − η buf

``per_tensor`` replaces the element-wise Gap by its mean over each model tensor. ``eta_max``
(the largest learning rate of the schedule) defaults to ``lr``. A stale push whose snapshot was
dropped for memory is applied with ``G = 1`` and reports ``snapshot_missing``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from psserver.core.rules.base import PushContext, Telemetry, UpdateRule, register
from psserver.core.rules.options import RuleOptionError, RuleOptions, option


@dataclass(frozen=True)
class GapAwareOptions(RuleOptions):
    gamma: float = option(0.999, "decay of the EMA of squared steps, below 1", low=0.0)
    epsilon: float = option(
        1e-8, "added to the step size C so a never-moved element has a finite gap", low=0.0, low_open=True
    )
    eta_max: float = option(0.0, "largest learning rate of the schedule; 0 means lr", low=0.0)
    momentum: float = option(0.0, "momentum mu of the base optimizer; > 0 is GA with momentum", low=0.0, high=1.0)
    weight_decay: float = option(0.0, "L2 weight decay, added to the gradient and penalised with it", low=0.0)
    per_tensor: bool = option(False, "one Gap per model tensor (its mean) instead of one per element")

    def __post_init__(self) -> None:
        if self.gamma >= 1.0:
            raise RuleOptionError(f"option gamma={self.gamma} is out of range: 0 <= value < 1")


def _segment_lengths(segments: tuple[tuple[int, int], ...], length: int) -> list[int]:
    return [end - start for start, end in segments] or [length]


@register
class GapAware(UpdateRule[GapAwareOptions]):
    name = "gap-aware"
    summary = "divides each gradient element by how far the model moved under it; many workers, large staleness"
    options_type = GapAwareOptions
    needs_snapshot = True

    def __init__(self, options: GapAwareOptions, length: int) -> None:
        super().__init__(options, length)
        self.step_average = torch.zeros(length)
        self.momentum_buffer = torch.zeros(length if options.momentum > 0 else 0)
        # A tensor, not an int, so a checkpoint restores it with the other state.
        self.steps = torch.zeros((), dtype=torch.int64)
        self._gap = torch.empty(length)
        self._bound = torch.empty(length)

    def apply(self, params: torch.Tensor, update: torch.Tensor, ctx: PushContext) -> Telemetry:
        opts = self.options
        gamma = opts.gamma
        self.steps.add_(1)
        # The squared step is read before the push changes the buffer, as the reference does.
        step = self.momentum_buffer if opts.momentum > 0 else update
        self.step_average.mul_(gamma).addcmul_(step, step, value=1.0 - gamma)
        if opts.weight_decay:
            update.add_(params, alpha=opts.weight_decay)
        telemetry: Telemetry = {"scale": 1.0, "gap": 0.0}
        if ctx.staleness > 0:
            stale = ctx.snapshot()
            if stale is not None:
                telemetry.update(self._penalise(params, update, stale, ctx.segments))
            else:
                # An unknown gap is not a zero gap: leave it out of the gap statistics.
                telemetry = {"scale": 1.0, "snapshot_missing": 1.0}
        if opts.momentum > 0:
            self.momentum_buffer.mul_(opts.momentum).add_(update)
            params.add_(self.momentum_buffer, alpha=-opts.lr)
        else:
            params.add_(update, alpha=-opts.lr)
        return telemetry

    def _penalise(
        self, params: torch.Tensor, update: torch.Tensor, stale: torch.Tensor, segments: tuple[tuple[int, int], ...]
    ) -> Telemetry:
        """Divide ``update`` by the Gap in place; returns the mean 1/G and the mean gap."""
        opts = self.options
        eta_max = opts.eta_max or opts.lr
        bias_correction = 1.0 - opts.gamma ** int(self.steps)
        # C = η_max sqrt(v) / sqrt(1 − γ^k) + η_max ε, folded into two scalar passes.
        bound = torch.sqrt(self.step_average, out=self._bound)
        bound.mul_(eta_max / math.sqrt(bias_correction)).add_(eta_max * opts.epsilon)
        ratio = torch.sub(params, stale, out=self._gap).abs_().div_(bound)
        if opts.per_tensor:
            views = torch.split(ratio, _segment_lengths(segments, self.length))
            means = [float(view.mean()) if view.numel() else 0.0 for view in views]
            for view, mean in zip(views, means, strict=True):
                view.fill_(mean)
        mean_gap = float(ratio.mean())
        penalty = ratio.add_(1.0).reciprocal_()
        update.mul_(penalty)
        return {"scale": float(penalty.mean()), "gap": mean_gap}

    def state_tensors(self) -> dict[str, torch.Tensor]:
        state = {"step_average": self.step_average, "steps": self.steps}
        if self.options.momentum > 0:
            state["momentum_buffer"] = self.momentum_buffer
        return state
