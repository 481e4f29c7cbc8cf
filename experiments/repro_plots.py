"""The reproduction's plots: one PNG per experiment, every series told apart by colour, marker and line."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from experiments.repro_common import Aggregates, Experiment, as_float

SERIES_MARKERS = ("o", "s", "^", "D", "v", "P")
SERIES_LINES = ("-", "--", ":", "-.")


def series_styles(series: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Matplotlib styles that keep every series apart.

    Up to ten series each get a colour of their own. Beyond that the default palette would
    repeat, so a label "METHOD VARIANT" (e.g. "AGN λ=5") takes its colour from the method and
    its line style and marker from the variant.
    """
    palette = [f"C{index}" for index in range(10)]
    if len(series) <= len(palette):
        return {label: {"color": palette[index], "marker": "o", "linestyle": "-"} for index, label in enumerate(series)}
    methods = list(dict.fromkeys(label.split(" ", 1)[0] for label in series))
    variants = list(dict.fromkeys(label.partition(" ")[2] for label in series))
    return {
        label: {
            "color": palette[methods.index(label.split(" ", 1)[0]) % len(palette)],
            "marker": SERIES_MARKERS[variants.index(label.partition(" ")[2]) % len(SERIES_MARKERS)],
            "linestyle": SERIES_LINES[variants.index(label.partition(" ")[2]) % len(SERIES_LINES)],
        }
        for label in series
    }


def _time_to_target(ax: Any, agg: Aggregates, series: list[str]) -> None:
    """Each series' time to the target accuracy as a bar, fastest first (BSP in red)."""
    order = sorted(series, key=lambda s: as_float(agg[(s, 4.0)]["mean"]))
    means = [as_float(agg[(s, 4.0)]["mean"]) for s in order]
    stds = [as_float(agg[(s, 4.0)]["std"]) for s in order]
    colors = ["tab:red" if s.startswith("BSP") else "tab:blue" for s in order]
    ax.barh(order, means, xerr=stds, color=colors)
    ax.invert_yaxis()
    ax.set_xlabel("virtual seconds to the target accuracy (mean ± std over seeds)")


def _accuracy_curves(curves: Any, exp: Experiment, runs: dict[int, dict[int, dict[str, Any]]]) -> None:
    """Every point's test accuracy over virtual time, of its first seed (BSP and SSP dashed)."""
    for index, point in enumerate(exp.points):
        curve = runs[index][min(runs[index])]["curve"]
        style = "--" if point.series.startswith(("BSP", "SSP")) else "-"
        curves.plot([c[0] for c in curve], [c[2] for c in curve], style, label=point.series, linewidth=1)
    curves.set_xlabel("virtual seconds")
    curves.set_ylabel("test accuracy (seed 0)")
    curves.set_ylim(0, 1)
    curves.legend(fontsize=6, ncol=2)
    curves.grid(alpha=0.3)


def _metric_over_x(ax: Any, exp: Experiment, agg: Aggregates, series: list[str]) -> None:
    """Each series' metric (mean ± std over seeds) over the experiment's x axis."""
    styles = series_styles(series)
    for label in series:
        xs = sorted(x for s, x in agg if s == label)
        means = [as_float(agg[(label, x)]["mean"]) for x in xs]
        stds = [as_float(agg[(label, x)]["std"]) for x in xs]
        ax.errorbar(xs, means, yerr=stds, capsize=3, label=label, linewidth=1.2, markersize=4, **styles[label])
    ax.set_xlabel(exp.xlabel)
    ax.set_ylabel(exp.metric_label)
    if exp.log_y:
        ax.set_yscale("log")
    if exp.log_x:
        ax.set_xscale("log", base=exp.log_base)
    ax.legend(fontsize=7, ncol=2 if len(series) > 6 else 1)


def _telemetry_over_x(extra: Any, exp: Experiment, agg: Aggregates, series: list[str]) -> None:
    """The mean of the rule's telemetry value ``exp.extra_plot`` over the x axis, for the series that report it."""
    for label in series:
        xs = sorted(x for s, x in agg if s == label)
        tele = [agg[(label, x)]["telemetry"] for x in xs]
        ys = [t.get(exp.extra_plot, math.nan) if isinstance(t, dict) else math.nan for t in tele]
        if not all(math.isnan(y) for y in ys):
            extra.plot(xs, ys, marker="o", label=label)
    extra.set_xlabel(exp.xlabel)
    extra.set_ylabel(f"mean of telemetry '{exp.extra_plot}'")
    if exp.log_x:
        extra.set_xscale("log", base=exp.log_base)
    extra.legend(fontsize=7)
    extra.grid(alpha=0.3)


def plot(exp: Experiment, agg: Aggregates, runs: dict[int, dict[int, dict[str, Any]]], path: Path) -> None:
    """``exp``'s metric over its x axis (or time to target as bars, beside seed 0's curves) to ``path``."""
    series = list(dict.fromkeys(p.series for p in exp.points))
    panels = 2 if exp.extra_plot or exp.metric == "time_to_target_s" else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.6), squeeze=False)
    ax = axes[0][0]
    if exp.metric == "time_to_target_s":
        _time_to_target(ax, agg, series)
        _accuracy_curves(axes[0][1], exp, runs)
    else:
        _metric_over_x(ax, exp, agg, series)
        if exp.extra_plot:
            _telemetry_over_x(axes[0][1], exp, agg, series)
    ax.grid(alpha=0.3)
    # A one-panel figure is too narrow for a long title on one line.
    fig.suptitle(textwrap.fill(exp.title, 62 * panels, break_on_hyphens=False), fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
