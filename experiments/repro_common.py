"""What every reproduction shares: points, series, experiments, and how aggregates are compared.

An :class:`Experiment` lists its points (a series label, an x value, a simulator configuration)
and a ``judge`` that turns the aggregates (mean ± std over seeds per point) into a verdict.
The helpers read those aggregates and say whether one series beats another beyond the spread.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from pstools.simulate import SimConfig, SpeedModel

EXP = SpeedModel.parse("exp")
HETERO = SpeedModel.parse("1:1:2:4")
CONSTANT = SpeedModel.parse("constant")


@dataclass(frozen=True)
class Series:
    label: str
    config: SimConfig  # workers / delay are set per x


@dataclass(frozen=True)
class Point:
    series: str
    x: float
    config: SimConfig


# (series, x) -> {"mean", "std", "values", "diverged", "telemetry", ...}
Aggregates = dict[tuple[str, float], dict[str, object]]


@dataclass
class Experiment:
    key: str
    title: str
    paper: str
    claim: str
    setup: str
    xlabel: str
    points: list[Point]
    judge: Callable[[Aggregates], tuple[str, str]]
    metric: str = "test_accuracy"  # or "time_to_target_s", or "metric_value" (the task's own metric)
    metric_label: str = "final test accuracy (mean ± std over seeds)"  # the plot's y axis
    log_y: bool = False  # a metric whose failures are orders of magnitude off (a diverging loss)
    log_x: bool = True
    extra_plot: str | None = None  # a telemetry key plotted beside the metric
    notes: list[str] = field(default_factory=list)
    task: str = "digits"  # the task family the experiment runs on (selected by --tasks)
    log_base: int = 2


@dataclass(frozen=True)
class Scale:
    """One task's sizes for an experiment builder (the digits defaults live in each builder).

    ``family`` is what ``--tasks`` selects; ``key`` and ``title`` get ``suffix`` and ``variant``
    appended, so a task's variant sits beside the digits experiment in one report.
    """

    task: str  # the simulator's task
    words: str  # how the set-up names it
    steps: int
    xs: tuple[int, ...]  # workers or delays
    lrs: tuple[str, ...] = ()  # each builder says what its rates are
    windows: tuple[int, ...] = ()
    series: tuple[str, ...] = ()  # a subset of the builder's series (empty: all)
    family: str = "fashion"
    suffix: str = "-fashion"
    variant: str = " (Fashion-MNIST CNN)"


def as_float(value: object) -> float:
    """An aggregate's number (``Aggregates`` values are typed ``object``)."""
    assert isinstance(value, float)
    return value


def mean_of(agg: Aggregates, series: str, x: float) -> float:
    value = agg[(series, x)]["mean"]
    assert isinstance(value, float)
    return value


def std_of(agg: Aggregates, series: str, x: float) -> float:
    value = agg[(series, x)]["std"]
    assert isinstance(value, float)
    return value


def xs_of(agg: Aggregates, series: str) -> list[float]:
    return sorted(x for s, x in agg if s == series)


def beats(agg: Aggregates, a: str, b: str, x: float, higher_is_better: bool = True) -> int:
    """+1 when a's mean beats b's by more than both spreads, −1 the other way, 0 within the spread.

    ``higher_is_better=False`` for a metric such as a loss: the lower mean beats."""
    gap = mean_of(agg, a, x) - mean_of(agg, b, x)
    if not higher_is_better:
        gap = -gap
    if math.isnan(gap):  # both diverged: neither beats the other
        return 0
    spread = max(std_of(agg, a, x) + std_of(agg, b, x), 0.005)
    return 1 if gap > spread else -1 if gap < -spread else 0


def relation(outcome: int) -> str:
    return "better than" if outcome == 1 else "worse than" if outcome == -1 else "within the spread of"


def fmt(agg: Aggregates, series: str, x: float) -> str:
    return f"{mean_of(agg, series, x):.3f} ± {std_of(agg, series, x):.3f}"


def grid(series: list[Series], xs: list[int], axis: str) -> list[Point]:
    points = []
    for s in series:
        for x in xs:
            config = replace(s.config, delay=x) if axis == "delay" else replace(s.config, workers=x)
            points.append(Point(s.label, float(x), config))
    return points
