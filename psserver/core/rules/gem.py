"""GEM — Gradient Energy Matching (Hermans & Louppe, 2018, "Gradient Energy Matching for
Distributed Asynchronous Gradient Descent").

Everything element-wise happens on the worker: with ``s`` the parameters its gradient was
computed on, ``Δ = −η ∇L(s)``, the proxy momentum ``m ← μ m + Δ`` and the current centre ``θ``,

    π = clamp((κ |m| − |θ − s|) ⊘ (|Δ| + ε), 0, π_max)

and it pushes ``π ⊙ Δ`` so that the centre's momentum energy matches the proxy's. The server
adds the delta:

    θ ← θ + π ⊙ Δ

``atomic`` makes the worker pull and commit with no other commit in between (the reference's
behaviour): its pull is exclusive, a *reservation* of the shard (``Reservation``) that holds
off every other worker's push (and exclusive pull) until the holder pushes, leaves, or the
reservation lapses (the shard's ``exclusive_pull_seconds``). Its pushes never queue for a
receive buffer behind the pushes that wait for it. ``local_apply`` adds the worker's own
``π ⊙ Δ`` to its copy before the next gradient. The worker sends the median of ``π``, reported
as ``scale``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from psserver.core.rules.base import (
    PayloadKind,
    PullTaken,
    PushContext,
    ShardView,
    Telemetry,
    UpdateRule,
    Wait,
    register,
)
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


@dataclass(frozen=True)
class Reservation:
    """Which worker holds the shard for its next push (atomic mode), and until when."""

    holder: int | None = None
    until: float = 0.0

    def holder_at(self, now: float) -> int | None:
        """The holder, or None once the reservation lapsed."""
        return self.holder if self.holder is not None and now <= self.until else None

    def admits(self, worker_id: int, now: float) -> bool:
        """Whether ``worker_id``'s push (or reserved pull) may go on now."""
        return self.holder_at(now) in (None, worker_id)

    def taken_by(self, worker_id: int, now: float, seconds: float) -> Reservation:
        """The reservation after ``worker_id``'s reserved pull: pulling again does not extend a
        reservation it holds (it lapses on time without a push)."""
        if self.holder_at(now) == worker_id:
            return self
        return Reservation(worker_id, now + seconds)

    def released_by(self, worker_id: int) -> Reservation:
        """The reservation after ``worker_id`` pushed or left."""
        return NO_RESERVATION if self.holder == worker_id else self


NO_RESERVATION = Reservation()


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

    def __init__(self, options: GemOptions, length: int) -> None:
        super().__init__(options, length)
        self.reservation = NO_RESERVATION

    # -- scheduling: the reservation of atomic mode --

    def exclusive_pull_refusal(self) -> str | None:
        return None if self.options.atomic else super().exclusive_pull_refusal()

    def _admits(self, worker_id: int, view: ShardView) -> Wait:
        return Wait(lambda: self.reservation.admits(worker_id, view.now()))

    def pull_wait(self, worker_id: int, exclusive: bool, view: ShardView) -> Wait | None:
        return self._admits(worker_id, view) if exclusive else None

    def pull_taken(self, worker_id: int, exclusive: bool, view: ShardView) -> PullTaken:
        if exclusive:
            self.reservation = self.reservation.taken_by(worker_id, view.now(), view.exclusive_pull_seconds)
        return PullTaken()

    def push_wait(self, worker_id: int, view: ShardView) -> Wait | None:
        return self._admits(worker_id, view)

    def push_taken(self, worker_id: int) -> None:
        self.reservation = self.reservation.released_by(worker_id)

    def push_has_priority(self, worker_id: int, now: float) -> bool:
        return self.reservation.holder_at(now) == worker_id

    def on_leave(self, worker_id: int) -> None:
        self.reservation = self.reservation.released_by(worker_id)
