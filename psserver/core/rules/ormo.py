"""OrMo — Ordered Momentum (Shi et al., 2024, "Ordered Momentum for Asynchronous
SGD"), and OrMo-DA, its delay-adaptive learning rate.

Reconstructed from the papers' abstracts and related code; see the note in docs/rules.md.
The server keeps the parameters ``w``, a momentum ``u`` and an iteration index ``I``; a worker
is tagged with the ``I`` it pulled at, ``j``. A gradient ``g`` of lag ``d = I − j``:

    u ← u + β^d η g
    w ← w − ((1 − β^{d+1}) / (1 − β)) η g        (the momentum steps this gradient missed; d + 1 when β = 1)
    if the iteration advances:  w ← w − β u ;  u ← β u ;  I ← I + 1

``advance=fresh`` opens the next iteration when a gradient of the current one (``d = 0``)
arrives; ``advance=every_k`` after every ``k`` gradients. Each gradient then counts in
momentum by the iteration it was computed at, not by when it arrived, so with fixed gradients
any arrival order gives the same parameters as synchronous momentum SGD. A worker with no
tag, or a tag from the future (the server restarted under it), is taken as fresh (``d = 0``).
The tags are part of the rule's state (``state_tensors()["tags"]``, rows of ``(worker id, j)``),
so a shard restored from a checkpoint computes a worker's lag from the tag it saved.

OrMo-DA scales ``η`` by ``min(1, K / τ)`` (``K`` = the option ``k``, ``τ = 0`` gives 1), so very
stale gradients take smaller steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from psserver.core.rules._kernels import momentum_step, split
from psserver.core.rules.base import PushContext, Telemetry, UpdateRule, copy_state, register
from psserver.core.rules.options import RuleOptions, option


@dataclass(frozen=True)
class OrmoOptions(RuleOptions):
    beta: float = option(0.9, "momentum beta", low=0.0, high=1.0)
    advance: str = option(
        "fresh",
        "fresh: next iteration on a gradient of the current one; every_k: after every k gradients",
        choices=("fresh", "every_k"),
    )
    k: int = option(4, "gradients per iteration (every_k); the K of ormo-da's min(1, K/tau)", low=1)


@register
class Ormo(UpdateRule[OrmoOptions]):
    name = "ormo"
    summary = "momentum ASGD that orders gradients by the iteration they were computed at; momentum under staleness"
    options_type = OrmoOptions

    def __init__(self, options: OrmoOptions, length: int) -> None:
        super().__init__(options, length)
        self.momentum = torch.zeros(length)
        # Tensors, not ints, so a checkpoint restores them with the other state.
        self.iteration = torch.zeros((), dtype=torch.int64)
        self.arrivals = torch.zeros((), dtype=torch.int64)
        self.tags: dict[int, int] = {}

    def on_pull(self, worker_id: int) -> None:
        self.tags[worker_id] = int(self.iteration)

    def on_leave(self, worker_id: int) -> None:
        self.tags.pop(worker_id, None)

    def step_scale(self, staleness: int) -> float:
        """The factor on ``η`` for a push of this staleness (1 for OrMo)."""
        return 1.0

    def apply(self, params: torch.Tensor, update: torch.Tensor, ctx: PushContext) -> Telemetry:
        opts = self.options
        beta = opts.beta
        iteration = int(self.iteration)
        tag = self.tags.get(ctx.worker_id, iteration)
        lag = iteration - tag if tag <= iteration else 0
        scale = self.step_scale(ctx.staleness)
        lr = opts.lr * scale
        missed = float(lag + 1) if beta == 1.0 else (1.0 - beta ** (lag + 1)) / (1.0 - beta)
        self.arrivals.add_(1)
        advance = lag == 0 if opts.advance == "fresh" else int(self.arrivals) >= opts.k
        # One cache block at a time. On an advance, u ← β (u + β^d η g) ; w ← w − u is one pass of
        # the fused SGD kernel (momentum β, gradient scale β^{d+1} η, lr 1).
        for p, g, u in zip(split(params), split(update), split(self.momentum), strict=True):
            if advance:
                momentum_step(p, u, g, momentum=beta, lr=1.0, gradient_scale=beta ** (lag + 1) * lr)
            else:
                u.add_(g, alpha=beta**lag * lr)
            p.add_(g, alpha=-missed * lr)
        if advance:
            self.iteration.add_(1)
            self.arrivals.zero_()
        return {"lag": float(lag), "iteration": float(int(self.iteration)), "scale": scale}

    def _counters(self) -> dict[str, torch.Tensor]:
        return {"momentum": self.momentum, "iteration": self.iteration, "arrivals": self.arrivals}

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The momentum and counters (views of the live state) and the tags: a new ``(n, 2)`` int64
        tensor of ``(worker id, tag)`` rows, since their number follows the workers."""
        rows = sorted(self.tags.items())
        tags = torch.tensor(rows, dtype=torch.int64) if rows else torch.zeros((0, 2), dtype=torch.int64)
        return {**self._counters(), "tags": tags}

    def load_state_tensors(self, saved: Mapping[str, torch.Tensor]) -> None:
        """A state saved without tags (an older checkpoint) leaves every worker fresh."""
        tags = saved.get("tags")
        if tags is not None and (tags.dim() != 2 or tags.shape[1] != 2 or tags.is_floating_point()):
            raise ValueError(f"'tags' of shape {tuple(tags.shape)} and dtype {tags.dtype}; expected (n, 2) integers")
        copy_state(self._counters(), saved)
        self.tags = {} if tags is None else {int(worker): int(tag) for worker, tag in tags.tolist()}


@register
class OrmoDa(Ormo):
    name = "ormo-da"
    summary = "OrMo with eta scaled by min(1, K/tau); very stale workers (slow GPUs among fast ones)"

    def step_scale(self, staleness: int) -> float:
        return min(1.0, self.options.k / staleness) if staleness > 0 else 1.0
