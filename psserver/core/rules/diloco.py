"""DiLoCo and Delayed Nesterov — outer optimizers on the pseudo-gradient of local steps.

Sources: Douillard et al., 2023, "DiLoCo: Distributed Low-Communication Training of Language
Models" (arXiv 2311.08105); Liu, Douillard et al., 2024, "Asynchronous Local-SGD Training for
Language Modeling" (arXiv 2401.09135, Algorithm 3).

Workers take ``H`` (option ``window``) steps of their own inner optimizer, whose state stays on
the worker, and push ``Δ = θ_end − θ_start`` (kind ``delta``, not divided by ``H``). The server
works on the pseudo-gradient ``g = −Δ`` with the outer learning rate ``ε`` (``lr``).

``diloco`` — outer Nesterov, one step per push, state ``m``::

    m ← μ m + g
    θ ← θ − ε (g + μ m)          # nesterov=false:  θ ← θ − ε m

Under ``--consistency bsp`` the shard averages the round's pushes before the rule sees them,
so ``g`` is the mean pseudo-gradient: synchronous DiLoCo exactly. Asynchronous, it is the
paper's "async DiLoCo" baseline.

``diloco-dn`` — Delayed Nesterov, state ``m`` and accumulator ``a``, period ``N``, ``c ∈ [0, 1/N]``,
``t`` the shard's clock before this push::

    a ← a + g
    if (t + 1) mod N == 0:
        m ← μ m + a / N
        θ ← θ − ε ((1 − cN + c) μ m + g / N)
        a ← 0
    else:
        θ ← θ − ε (c μ m + g / N)

Every push moves ``θ`` at ``ε/N``; the ``N`` pushes of a period together move it as one
Nesterov step on their mean would. ``m`` and ``a`` are checkpointed with the clock, so a
restored shard continues its period. Telemetry: ``scale`` 1 (``ε/N`` is no staleness penalty)
and, for DN, ``momentum_step`` (1 when this push closed a period).

``pull_grace`` (DN, seconds): pushes that land within the grace of each other are all applied
before their workers pull (``_pull_hold``, through the rule's pull and push hooks), as the
paper's reference scheduler does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, TypeVar

import torch

from psserver.core.consistency import ConsistencyModel
from psserver.core.rules._pull_hold import PULL_GRACE_UNDER_BSP, PullHolds
from psserver.core.rules._windowed import WindowedOptions, WindowedRule
from psserver.core.rules.base import (
    PayloadKind,
    PullHold,
    PullTaken,
    PushContext,
    PushDecision,
    ShardView,
    Telemetry,
    Wait,
    register,
)
from psserver.core.rules.options import RuleOptionError, option


@dataclass(frozen=True)
class OuterOptions(WindowedOptions):
    """What both rules share: the outer step (server) and the local steps (worker)."""

    lr: float = option(0.7, "outer learning rate epsilon on the pseudo-gradient g = -delta", low=0.0, low_open=True)
    momentum: float = option(0.9, "outer momentum mu, below 1", low=0.0)
    window: int = option(20, "local steps H of the worker's inner optimizer per push", low=1)
    local_lr: float = option(
        0.05, "learning rate of the worker's local SGD when its task brings no optimizer", low=0.0, low_open=True
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.momentum >= 1.0:
            raise RuleOptionError(f"option momentum={self.momentum} is out of range: 0 <= value < 1")


@dataclass(frozen=True)
class DilocoOptions(OuterOptions):
    nesterov: bool = option(True, "Nesterov outer momentum (false: theta <- theta - lr m)")


@dataclass(frozen=True)
class DelayedNesterovOptions(OuterOptions):
    period: int = option(4, "pushes N per momentum update (the paper's notebook uses the worker count)", low=1)
    c: float = option(0.0, "share c of the momentum applied between momentum updates, at most 1/period", low=0.0)
    pull_grace: float = option(
        0.0,
        "seconds within which pushes that land together are all applied before their workers pull "
        "(0: pull at once; the paper's scheduler waits)",
        low=0.0,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.c > 1.0 / self.period:
            raise RuleOptionError(
                f"option c={self.c:g} is out of range: 0 <= c <= 1/period = {1.0 / self.period:g} "
                f"(period={self.period})"
            )

    def consistency_refusal(self, consistency: ConsistencyModel) -> str | None:
        refusal = super().consistency_refusal(consistency)
        if refusal is None and self.pull_grace > 0 and consistency is ConsistencyModel.BSP:
            return PULL_GRACE_UNDER_BSP
        return refusal


OuterT = TypeVar("OuterT", bound=OuterOptions)


class _OuterRule(WindowedRule[OuterT]):
    """Delta pushes from the ``diloco`` procedure; ``m`` is checkpointed."""

    accepted_kinds: ClassVar[frozenset[PayloadKind]] = frozenset({PayloadKind.DELTA})
    worker_procedure = "diloco"

    def __init__(self, options: OuterT, length: int) -> None:
        super().__init__(options, length)
        self.momentum = torch.zeros(length)

    def procedure_options(self) -> dict[str, str]:
        return self.options.procedure_strings()

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"momentum": self.momentum}


@register
class Diloco(_OuterRule[DilocoOptions]):
    name = "diloco"
    summary = (
        "workers take H local steps of their own optimizer; the server takes an outer Nesterov step on the "
        "pseudo-gradient; synchronous DiLoCo under --consistency bsp"
    )
    options_type = DilocoOptions

    def apply(self, params: torch.Tensor, update: torch.Tensor, ctx: PushContext) -> Telemetry:
        options = self.options
        lr, mu = options.lr, options.momentum
        gradient = update.neg_()  # the pseudo-gradient g = −Δ, in the scratch the shard handed over
        self.momentum.mul_(mu).add_(gradient)
        if options.nesterov:
            # θ − ε (g + μ m), in the same order as DN's period step so that N = 1 matches bit for bit.
            params.add_(gradient, alpha=-lr).add_(self.momentum, alpha=-lr * mu)
        else:
            params.add_(self.momentum, alpha=-lr)
        return {"scale": 1.0}


@register
class DelayedNesterov(_OuterRule[DelayedNesterovOptions]):
    name = "diloco-dn"
    summary = (
        "asynchronous DiLoCo with Delayed Nesterov: momentum updated once every N pushes, each push applied "
        "at lr/N; the paper's fix for asynchronous DiLoCo on workers of mixed speeds"
    )
    options_type = DelayedNesterovOptions

    def __init__(self, options: DelayedNesterovOptions, length: int) -> None:
        super().__init__(options, length)
        self.accumulator = torch.zeros(length)
        self.holds = PullHolds(options.pull_grace, self.assigned_window)

    # -- scheduling: the pull hold of ``pull_grace`` --

    @property
    def paced_window(self) -> int | None:
        """Paces are measured for assigned windows (``WindowedRule``) and for the holds, which ask when each
        worker will push next."""
        return self.options.window if self.options.pull_grace > 0 else super().paced_window

    def pull_wait(self, worker_id: int, exclusive: bool, view: ShardView) -> Wait | None:
        return self.holds.wait(worker_id, view)

    def pull_taken(self, worker_id: int, exclusive: bool, view: ShardView) -> PullTaken:
        return PullTaken(restart_window=self.holds.release(worker_id))

    def pull_hold(self, worker_id: int, view: ShardView) -> PullHold | None:
        return self.holds.active(worker_id, view)

    def pull_hold_pending(self, worker_id: int) -> bool:
        hold = self.holds.of(worker_id)
        return hold is not None and not hold.released

    def after_push(self, worker_id: int, view: ShardView) -> PushDecision:
        self.holds.after_push(worker_id, view.now())
        return super().after_push(worker_id, view)

    def on_leave(self, worker_id: int) -> None:
        self.holds.forget(worker_id)

    def apply(self, params: torch.Tensor, update: torch.Tensor, ctx: PushContext) -> Telemetry:
        options = self.options
        lr, mu, period, c = options.lr, options.momentum, options.period, options.c
        gradient = update.neg_()  # g = −Δ
        self.accumulator.add_(gradient)
        closes_period = (ctx.clock + 1) % period == 0
        params.add_(gradient, alpha=-lr / period)
        if closes_period:
            self.momentum.mul_(mu).add_(self.accumulator, alpha=1.0 / period)
            params.add_(self.momentum, alpha=-lr * (1.0 - c * period + c) * mu)
            self.accumulator.zero_()
        elif c > 0:
            params.add_(self.momentum, alpha=-lr * c * mu)
        return {"scale": 1.0, "momentum_step": 1.0 if closes_period else 0.0}

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return {"momentum": self.momentum, "accumulator": self.accumulator}
