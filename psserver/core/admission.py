"""Admission control as pure decisions: may this pull or push go on now, and how.

The shard asks, then acts (waits on its condition, adds to a round, applies); nothing here
holds a lock, waits or changes the shard, so every policy is tested with plain values.

- async: every push is applied on arrival; a pull may be answered with a version still being
  sent when ``pull_versions`` are in flight (its clock tells the worker the extra staleness).
- SSP: a pull waits while its worker is more than the bound ahead of the slowest live worker
  (``consistency.ssp_must_wait``).
- BSP: a push joins the current round (``bsp_round.BspRound``), whose mean is applied once.
- exclusive pulls: only a worker (never an observer) of a rule that takes them may ask; what such
  a pull and the pushes behind it wait for is the rule's decision (its scheduling hooks).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from psserver.core.consistency import Consistency, ConsistencyModel, ssp_must_wait
from psserver.core.errors import ErrorKind
from psserver.core.request_checks import Refusal


class PushRoute(enum.Enum):
    APPLY = "apply"  # applied on its own, once the rule lets it (its ``push_wait``)
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


def exclusive_pull_refusal(observer: bool, rule_refusal: str | None) -> Refusal | None:
    """Why this worker may not pull exclusively, or None: observers never push, so nobody could wait
    on them; ``rule_refusal`` is the rule's reason (``UpdateRule.exclusive_pull_refusal``)."""
    if observer:
        return Refusal(ErrorKind.BAD_REQUEST, "observers cannot take an exclusive pull; pull without one")
    if rule_refusal is not None:
        return Refusal(ErrorKind.BAD_REQUEST, rule_refusal)
    return None
