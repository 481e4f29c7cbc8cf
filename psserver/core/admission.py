"""Admission control as pure decisions: may this pull or push go on now, and how.

The shard asks, then acts (waits on its condition, adds to a round, applies); nothing here
holds a lock, waits or changes the shard, so every policy is tested with plain values.

- async: every push is applied on arrival; a pull may be answered with a version still being
  sent when ``pull_versions`` are in flight (its clock tells the worker the extra staleness).
- SSP: a pull waits while its worker is more than the bound ahead of the slowest live worker
  (``consistency.ssp_must_wait``).
- BSP: a push joins the current round (``bsp_round.BspRound``), whose mean is applied once.
- GEM reservation (atomic mode): a reserved pull holds off every other worker's push until the
  holder pushes or the reservation lapses.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from psserver.core.consistency import Consistency, ConsistencyModel, ssp_must_wait
from psserver.core.errors import ErrorKind
from psserver.core.request_checks import Refusal


class PushRoute(enum.Enum):
    APPLY = "apply"  # applied on its own, once no other worker holds a reservation
    BSP_ROUND = "bsp_round"  # added to the round; the round's mean is applied once every worker pushed


def push_route(model: ConsistencyModel) -> PushRoute:
    return PushRoute.BSP_ROUND if model is ConsistencyModel.BSP else PushRoute.APPLY


def pull_must_wait(consistency: Consistency, observer: bool, worker_clock: int, live_clocks: Iterable[int]) -> bool:
    """True while SSP holds this pull back (observers are never held)."""
    if consistency.model is not ConsistencyModel.SSP or observer:
        return False
    return ssp_must_wait(worker_clock, live_clocks, consistency.staleness_bound)


def may_share_version_in_flight(model: ConsistencyModel) -> bool:
    """Whether a pull may get an older version still being sent: only asynchronous training
    tolerates the extra staleness (SSP's bound and BSP's rounds count exact clocks)."""
    return model is ConsistencyModel.ASYNC


def reserve_refusal(observer: bool, rule_reserves_pulls: bool, rule_name: str) -> Refusal | None:
    """Why this worker may not reserve the shard, or None: only a worker of a rule that asks for
    reserved pulls (GEM's atomic mode) may hold off the others' pushes."""
    if observer:
        return Refusal(ErrorKind.BAD_REQUEST, "observers cannot reserve the shard; pull without reserve")
    if not rule_reserves_pulls:
        return Refusal(
            ErrorKind.BAD_REQUEST,
            f"rule {rule_name} with these options takes no reserved pulls (only gem with atomic=true does); "
            "pull without reserve",
        )
    return None


@dataclass(frozen=True)
class Reservation:
    """Which worker holds the shard for its next push (GEM atomic mode), and until when."""

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
