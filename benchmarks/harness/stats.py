"""Summaries of timed samples: median, quartiles, extremes and count; ratios taken repeat by repeat."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

Summary = dict[str, float]


def summarize(values: Sequence[float]) -> Summary:
    """Median, quartiles, extremes and count of ``values``."""
    ordered = sorted(values)
    if not ordered:
        return {"median": math.nan, "q1": math.nan, "q3": math.nan, "min": math.nan, "max": math.nan, "n": 0}
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return {
        "median": statistics.median(ordered),
        "q1": q1,
        "q3": q3,
        "min": ordered[0],
        "max": ordered[-1],
        "n": len(ordered),
    }


def scaled(summary: Summary, factor: float) -> Summary:
    """``summary`` in another unit (seconds to milliseconds: 1e3); the count stays."""
    return {key: value if key == "n" else value * factor for key, value in summary.items()}


def speed_ratio(
    first: Sequence[float], other: Sequence[float], first_samples: Sequence[float], other_samples: Sequence[float]
) -> dict[str, float]:
    """How much faster ``first`` is than ``other`` (their time / its time), per repeat and of the fastest steps."""
    return {
        **summarize([o / f for f, o in zip(first, other, strict=True)]),
        "of_fastest_steps": min(other_samples) / min(first_samples),
    }


def verdict(ratio: Summary) -> str:
    """A speed ratio's summary over repeats (above 1: faster) as a word: faster / slower when every
    repeat says so, else level."""
    if ratio["min"] > 1.0:
        return "faster"
    if ratio["max"] < 1.0:
        return "slower"
    return "level"
