"""What every windowed rule shares: the window ``H`` and DyLU, the local steps each worker is assigned.

A windowed rule's workers take ``window`` local steps and push once (DOWNPOUR, DynSGD, AGN,
EASGD/EAMSGD, DiLoCo, Delayed Nesterov). With ``dylu`` (Dynamic Local Updates; Liu, Douillard
et al., 2024, "Asynchronous Local-SGD Training for Language Modeling", arXiv 2401.09135, Eq. 6)
every push reply assigns its worker the local steps of its next window::

    H_w = max(h_min, floor(v_w / v_ref · H))      v_ref = max over live workers (dylu_ref=p90: their 90th percentile)

``v_w`` is the worker's speed in local steps per second, measured by the shard from its push
timing (``psserver.core.local_steps`` says how and why). Until it is known (a worker's first push
only starts the measurement), ``H_w = H``. With ``dylu_ref=p90`` the workers faster than the
percentile are assigned more than ``H``: that is what the choice is for (one outlier does not
shrink everybody's window).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from psserver.core.consistency import ConsistencyModel
from psserver.core.rules.base import LOCAL_STEPS_KEY, NOTHING_TO_DO, PushDecision, ShardView, UpdateRule
from psserver.core.rules.options import RuleOptionError, RuleOptions, declare_family, option

# The reference speeds DyLU can scale by (``dylu_ref``).
DYLU_REFERENCES = ("max", "p90")
# DyLU's options: the server's alone (the worker learns its steps from each push reply).
DYLU_OPTIONS = frozenset({"dylu", "dylu_min", "dylu_ref"})
# floor() of a ratio measured a hair below an integer (0.25 as 0.2499999999, times 20) still gives it.
_FLOOR_SLACK = 1e-9

DYLU_UNDER_BSP = (
    "DyLU (dylu=true) is for asynchronous training; under --consistency bsp every worker waits for the round "
    "anyway and the round's pushes are averaged with equal weight: drop dylu or use async"
)

declare_family(
    "dylu",
    "window",
    "(DyLU) needs a windowed rule, one whose workers take local steps between pushes "
    "(those with option window, e.g. downpour, agn, easgd, diloco-dn); this rule's workers push every step",
)


@dataclass(frozen=True)
class WindowedOptions(RuleOptions):
    window: int = option(5, "local steps H between pushes", low=1)
    dylu: bool = option(
        False, "Dynamic Local Updates: the server assigns each worker floor(v_w / v_ref * window) local steps"
    )
    dylu_min: int = option(1, "DyLU's fewest local steps h_min a worker is assigned, at most window", low=1)
    dylu_ref: str = option(
        "max",
        "DyLU's reference speed v_ref: the fastest live worker's, or their 90th percentile",
        choices=DYLU_REFERENCES,
    )

    def __post_init__(self) -> None:
        if self.dylu_min > self.window:
            raise RuleOptionError(
                f"option dylu_min={self.dylu_min} is out of range: 1 <= dylu_min <= window = {self.window}"
            )

    def procedure_strings(self) -> dict[str, str]:
        """The options the worker procedure is sent: all but DyLU's, whose result comes with every push reply."""
        return {name: text for name, text in self.as_strings().items() if name not in DYLU_OPTIONS}

    def consistency_refusal(self, consistency: ConsistencyModel) -> str | None:
        if self.dylu and consistency is ConsistencyModel.BSP:
            return DYLU_UNDER_BSP
        return super().consistency_refusal(consistency)


def reference_speed(speeds: Sequence[float], reference: str) -> float | None:
    """``v_ref``: the largest speed (``max``) or the 90th percentile, linear between ranks (``p90``)."""
    if not speeds:
        return None
    ordered = sorted(speeds)
    if reference == "max":
        return ordered[-1]
    if reference != "p90":
        raise ValueError(f"unknown DyLU reference {reference!r}; expected max or p90")
    position = 0.9 * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (position - below) * (ordered[above] - ordered[below])


def assigned_steps(speed: float | None, reference: float | None, window: int, minimum: int) -> int:
    """Eq. 6: ``max(h_min, floor(v_w / v_ref · H))``; ``H`` while either speed is unknown."""
    if speed is None or reference is None or reference <= 0:
        return window
    return max(minimum, math.floor(speed / reference * window + _FLOOR_SLACK))


WindowedT = TypeVar("WindowedT", bound=WindowedOptions)


class WindowedRule(UpdateRule[WindowedT]):
    """A rule whose workers take local steps between pushes: with ``dylu`` the shard measures their paces
    and every push reply assigns the worker its next window (Eq. 6)."""

    @property
    def paced_window(self) -> int | None:
        return self.options.window if self.options.dylu else None

    def assigned_window(self, worker_id: int, view: ShardView) -> int | None:
        """Eq. 6 for ``worker_id`` against the live workers' speeds known now; None without DyLU."""
        options = self.options
        if not options.dylu:
            return None
        reference = reference_speed(view.paces.known_speeds(), options.dylu_ref)
        return assigned_steps(view.paces.speed(worker_id), reference, options.window, options.dylu_min)

    def after_push(self, worker_id: int, view: ShardView) -> PushDecision:
        steps = self.assigned_window(worker_id, view)
        return NOTHING_TO_DO if steps is None else PushDecision({LOCAL_STEPS_KEY: float(steps)})
