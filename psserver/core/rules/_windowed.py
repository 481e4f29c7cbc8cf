"""The options every windowed rule shares: the window ``H`` and DyLU, its per-worker local steps.

A windowed rule's workers take ``window`` local steps and push once (DOWNPOUR, DynSGD, AGN,
EASGD/EAMSGD, DiLoCo, Delayed Nesterov). With ``dylu`` the server assigns each worker its own
number of local steps from its measured speed (Liu et al. 2024, Eq. 6; ``psserver.core.local_steps``)::

    H_w = max(h_min, floor(v_w / v_ref · H))      v_ref = max over live workers (dylu_ref=p90: their 90th percentile)
"""

from __future__ import annotations

from dataclasses import dataclass

from psserver.core.rules.options import RuleOptionError, RuleOptions, option

# The reference speeds DyLU can scale by (``dylu_ref``).
DYLU_REFERENCES = ("max", "p90")
# DyLU's options: the server's alone (the worker learns its steps from each push reply).
DYLU_OPTIONS = frozenset({"dylu", "dylu_min", "dylu_ref"})


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
