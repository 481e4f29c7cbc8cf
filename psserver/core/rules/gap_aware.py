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

from psserver.core.rules import _kernels
from psserver.core.rules._kernels import momentum_step, split
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
        # Scratch for one cache block: the Gap of a block is worked out while the block is cached.
        self._scratch = torch.empty(min(length, _kernels.BLOCK))
        self._root = torch.empty(min(length, _kernels.BLOCK))
        self._one = torch.ones(())
        # Imported here: numba costs about 150 MB of memory that servers of other rules need not pay.
        # Compiled (or loaded from numba's cache) now, not during the first stale push.
        from psserver.core.rules import _gap_kernel

        self._kernel = _gap_kernel
        _gap_kernel.warm_up()

    def apply(self, params: torch.Tensor, update: torch.Tensor, ctx: PushContext) -> Telemetry:
        self.steps.add_(1)
        telemetry: Telemetry = {"scale": 1.0, "gap": 0.0}
        stale = None
        if ctx.staleness > 0:
            stale = ctx.snapshot()
            if stale is None:
                # An unknown gap is not a zero gap: leave it out of the gap statistics.
                telemetry = {"scale": 1.0, "snapshot_missing": 1.0}
        if stale is not None and self.options.per_tensor:
            telemetry.update(self._apply_per_tensor(params, update, stale, ctx.segments))
        else:
            telemetry.update(self._apply_elementwise(params, update, stale))
        return telemetry

    def _bound_scalars(self) -> tuple[float, float]:
        """C = η_max (sqrt(v / (1 − γ^k)) + ε) = (sqrt(v) + ε sqrt(1 − γ^k)) / c; returns (ε sqrt(1 − γ^k), c)."""
        opts = self.options
        eta_max = opts.eta_max or opts.lr
        root_correction = math.sqrt(1.0 - opts.gamma ** int(self.steps))
        return opts.epsilon * root_correction, root_correction / eta_max

    def _average_steps(self, average: torch.Tensor, step: torch.Tensor) -> None:
        """v ← γ v + (1 − γ) q ⊙ q on one block."""
        gamma = self.options.gamma
        average.mul_(gamma).addcmul_(step, step, value=1.0 - gamma)

    def _gap(
        self, params: torch.Tensor, stale: torch.Tensor, average: torch.Tensor, bound: tuple[float, float]
    ) -> torch.Tensor:
        """G = 1 + |θ − θ_{b_w}| ⊘ C of one block, in the scratch buffer: five passes over the block."""
        count = params.numel()
        floor, inverse = bound
        root = torch.sqrt(average, out=self._root[:count]).add_(floor)
        distance = torch.sub(params, stale, out=self._scratch[:count]).abs_()
        return torch.addcdiv(self._one, distance, root, value=inverse, out=distance)

    def _apply_elementwise(self, params: torch.Tensor, update: torch.Tensor, stale: torch.Tensor | None) -> Telemetry:
        """A stale push in one compiled pass; a fresh one (G = 1) is exactly the base optimizer."""
        opts = self.options
        momentum = self.momentum_buffer if opts.momentum > 0 else None
        if stale is not None:
            floor, inverse = self._bound_scalars()
            coefficients = self._kernel.Coefficients(
                opts.gamma, floor, inverse, weight_decay=opts.weight_decay, momentum=opts.momentum, lr=opts.lr
            )
            gaps, penalties = self._kernel.apply_elementwise(
                params, update, self.step_average, momentum, stale, coefficients
            )
            count = max(self.length, 1)
            return {"scale": penalties / count, "gap": gaps / count}
        # The squared step is read before the push changes the buffer, as the reference does.
        self._average_steps(self.step_average, momentum if momentum is not None else update)
        if opts.weight_decay:
            update.add_(params, alpha=opts.weight_decay)
        if momentum is not None:
            momentum_step(params, momentum, update, momentum=opts.momentum, lr=opts.lr)
        else:
            params.add_(update, alpha=-opts.lr)
        return {}

    def _apply_per_tensor(
        self, params: torch.Tensor, update: torch.Tensor, stale: torch.Tensor, segments: tuple[tuple[int, int], ...]
    ) -> Telemetry:
        """One Gap per model tensor: a pass for the per-tensor mean ratios, then one for the steps."""
        opts = self.options
        momentum = opts.momentum > 0
        bound = self._bound_scalars()
        lengths = _segment_lengths(segments, self.length)
        # The squared step is read before the push changes the buffer, as the reference does.
        steps = self.momentum_buffer if momentum else update
        tensors = (params, update, self.step_average, stale, steps)
        means: list[float] = []
        for pieces in zip(*(torch.split(t, lengths) for t in tensors), strict=True):
            sums = []
            for p, g, v, s, q in zip(*(split(t) for t in pieces), strict=True):
                self._average_steps(v, q)
                if opts.weight_decay:
                    g.add_(p, alpha=opts.weight_decay)
                sums.append(self._gap(p, s, v, bound).sum())
            count = pieces[0].numel()
            # The mean ratio is the mean G − 1.
            means.append(max(float(torch.stack(sums).double().sum()) / count - 1.0, 0.0) if count else 0.0)
        penalties = [1.0 / (1.0 + mean) for mean in means]
        segments_out = zip(torch.split(params, lengths), torch.split(update, lengths), penalties, strict=True)
        if momentum:
            for (p, g, penalty), q in zip(segments_out, torch.split(self.momentum_buffer, lengths), strict=True):
                # g̃ = g / G enters the buffer through the kernel's gradient scale.
                momentum_step(p, q, g, momentum=opts.momentum, lr=opts.lr, gradient_scale=penalty)
        else:
            for p, g, penalty in segments_out:
                p.add_(g.mul_(penalty), alpha=-opts.lr)
        weights = [length / max(self.length, 1) for length in lengths]
        return {
            "scale": sum(w * penalty for w, penalty in zip(weights, penalties, strict=True)),
            "gap": sum(w * mean for w, mean in zip(weights, means, strict=True)),
        }

    def state_tensors(self) -> dict[str, torch.Tensor]:
        state = {"step_average": self.step_average, "steps": self.steps}
        if self.options.momentum > 0:
            state["momentum_buffer"] = self.momentum_buffer
        return state
