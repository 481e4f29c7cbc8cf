"""What the time-to-accuracy race reports: medians over seeds, the targets, tables and the plot.

Every function takes the task's metric (:class:`psworker.task.Metric`, test accuracy unless
told): the target, "at budget" and "better" follow its direction, so a language model's race
is to a validation loss at most the target, and its final loss is compared with DDP's.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.harness.report import print_targets
from benchmarks.harness.stats import summarize
from experiments.harness.race import RaceSettings, RunResult
from psworker.task import ACCURACY, Metric

# The target: the best hetps rule reaches the accuracy this many times sooner than DDP...
SPEEDUP_TARGET = 1.5
# ...and ends within this much accuracy of DDP's (0.5 points)...
ACCURACY_TOLERANCE = 0.005
# ...or, for a task judged by its loss, at most this much above DDP's final loss.
LOSS_TOLERANCE = 0.02
# The local-SGD target: Delayed Nesterov with DyLU reaches the target this many times sooner than
# synchronous DiLoCo, and sooner than every per-step rule in the same run.
LOCAL_SGD_SPEEDUP_TARGET = 1.3


def mix_name(slowdowns: Sequence[float]) -> str:
    return ":".join(f"{s:g}" for s in slowdowns)


def at_budget(run: RunResult, metric: Metric = ACCURACY) -> float:
    """The run's metric when the budget ran out (a diverged loss is infinite, not NaN)."""
    if run.diverged:
        return metric.worst
    return metric.of(run.accuracy_at_budget, run.loss_at_budget)


def aggregate(runs: Sequence[RunResult], metric: Metric = ACCURACY) -> dict[str, dict[str, dict[str, Any]]]:
    """mix → system → medians and spreads over seeds; a run that never reached the target counts as infinite.

    ``metric_at_budget`` is the task's metric at the budget (``accuracy_at_budget`` is always there)."""
    grouped: dict[str, dict[str, list[RunResult]]] = {}
    for run in runs:
        grouped.setdefault(mix_name(run.slowdowns), {}).setdefault(run.system, []).append(run)
    summary: dict[str, dict[str, dict[str, Any]]] = {}
    for mix, systems in grouped.items():
        summary[mix] = {}
        for system, seeds in systems.items():
            times = [r.time_to_target if r.time_to_target is not None else math.inf for r in seeds]
            staleness = [
                statistics.fmean(float(r.workers[rank]["mean_staleness"]) for r in seeds)
                for rank in range(len(seeds[0].workers))
            ]
            overruns = sum(int(w["overrun_steps"]) for r in seeds for w in r.workers)
            steps = sum(int(w["steps"]) for r in seeds for w in r.workers)
            summary[mix][system] = {
                "lr": seeds[0].lr,
                "time_to_target": summarize(times),
                "reached": sum(t != math.inf for t in times),
                "accuracy_at_budget": summarize([r.accuracy_at_budget for r in seeds]),
                "metric_at_budget": summarize([at_budget(r, metric) for r in seeds]),
                "samples_per_second": summarize([r.samples_per_second for r in seeds]),
                "staleness_per_worker": staleness,
                "diverged": sum(r.diverged for r in seeds),
                "overrun_fraction": overruns / steps if steps else 0.0,
            }
    return summary


def targets(summary: dict[str, dict[str, dict[str, Any]]], mix: str, metric: Metric = ACCURACY) -> list[dict[str, Any]]:
    """The issue's target on ``mix``: best hetps rule vs DDP, time to target and the final metric.

    The metric gap is signed so that positive is better than DDP: the rule's accuracy minus
    DDP's, or DDP's loss minus the rule's."""
    systems = summary.get(mix, {})
    if "ddp" not in systems or len(systems) < 2:
        return []
    ddp = systems["ddp"]
    rules = {name: s for name, s in systems.items() if name != "ddp"}
    sign = 1.0 if metric.higher_is_better else -1.0

    def final(system: dict[str, Any]) -> float:
        # Summaries written before the metric existed carry only the accuracy.
        return float(system.get("metric_at_budget", system["accuracy_at_budget"])["median"])

    best = min(rules, key=lambda n: (rules[n]["time_to_target"]["median"], -sign * final(rules[n])))
    rule = rules[best]
    ddp_time = ddp["time_to_target"]["median"]
    rule_time = rule["time_to_target"]["median"]
    speedup = ddp_time / rule_time if math.isfinite(rule_time) else 0.0
    gap = sign * (final(rule) - final(ddp))
    tolerance = ACCURACY_TOLERANCE if metric.higher_is_better else LOSS_TOLERANCE
    if metric.higher_is_better:
        gap_words = f"{best}'s accuracy at budget − DDP's"
    else:
        gap_words = f"DDP's loss − {best}'s at budget"
    lower_bound = " (DDP never reached it: a lower bound)" if not math.isfinite(ddp_time) else ""
    return [
        {
            "target": f"{mix}: DDP's time to target / {best}'s",
            "measured": speedup,
            "min": speedup,
            "max": speedup,
            "threshold": SPEEDUP_TARGET,
            "comparison": ">=",
            "pass": bool(speedup >= SPEEDUP_TARGET),
            "detail": f"medians {ddp_time:.1f} s vs {rule_time:.1f} s{lower_bound}",
            "best_rule": best,
        },
        {
            "target": f"{mix}: {gap_words}",
            "measured": gap,
            "min": gap,
            "max": gap,
            "threshold": -tolerance,
            "comparison": ">=",
            "pass": bool(gap >= -tolerance),
            "detail": "medians over seeds",
            "best_rule": best,
        },
    ]


def local_sgd_targets(
    summary: dict[str, dict[str, dict[str, Any]]], mix: str, candidate: str, synchronous: str, per_step: Sequence[str]
) -> list[dict[str, Any]]:
    """The local-SGD target on ``mix``: ``candidate`` (Delayed Nesterov + DyLU) against ``synchronous``
    DiLoCo (≥ :data:`LOCAL_SGD_SPEEDUP_TARGET` sooner) and against each of the ``per_step`` rules that
    raced (sooner than the soonest), by median time to target. Nothing when either is missing."""
    systems = summary.get(mix, {})
    if candidate not in systems or synchronous not in systems:
        return []
    candidate_time = systems[candidate]["time_to_target"]["median"]
    synchronous_time = systems[synchronous]["time_to_target"]["median"]
    speedup = synchronous_time / candidate_time if math.isfinite(candidate_time) else 0.0
    lower_bound = f" ({synchronous} never reached it: a lower bound)" if not math.isfinite(synchronous_time) else ""
    goals = [
        {
            "target": f"{mix}: {synchronous}'s time to target / {candidate}'s",
            "measured": speedup,
            "min": speedup,
            "max": speedup,
            "threshold": LOCAL_SGD_SPEEDUP_TARGET,
            "comparison": ">=",
            "pass": bool(speedup >= LOCAL_SGD_SPEEDUP_TARGET),
            "detail": f"medians {_seconds(synchronous_time)} s vs {_seconds(candidate_time)} s{lower_bound}",
            "best_rule": candidate,
        }
    ]
    raced = [name for name in per_step if name in systems]
    if raced:
        soonest = min(raced, key=lambda name: systems[name]["time_to_target"]["median"])
        soonest_time = systems[soonest]["time_to_target"]["median"]
        ratio = soonest_time / candidate_time if math.isfinite(candidate_time) else 0.0
        goals.append(
            {
                "target": f"{mix}: soonest per-step rule's time to target / {candidate}'s",
                "measured": ratio,
                "min": ratio,
                "max": ratio,
                "threshold": 1.0,
                "comparison": ">",
                "pass": bool(ratio > 1.0),
                "detail": f"{soonest} {_seconds(soonest_time)} s of {', '.join(raced)}",
                "best_rule": candidate,
            }
        )
    return goals


def _seconds(value: float) -> str:
    return f"{value:.1f}" if math.isfinite(value) else "—"


def print_tables(
    summary: dict[str, dict[str, dict[str, Any]]],
    goals: list[dict[str, Any]],
    settings: RaceSettings,
    console: Console,
    metric: Metric = ACCURACY,
) -> None:
    short = "acc" if metric.name == "accuracy" else metric.name
    for mix, systems in summary.items():
        table = Table(
            title=f"{settings.task}, speeds {mix}: seconds to {metric.label} {settings.target} "
            f"(budget {settings.budget_seconds:g} s, 1× step {settings.step_seconds:g} s"
            + (f", a shared {settings.link_mbit:g} Mbit/s link)" if settings.link_mbit else ")")
        )
        for column in ("system", "lr", "to target (median)", "min–max", "reached", f"{short} at budget", "min–max"):
            table.add_column(column, justify="left" if column == "system" else "right")
        for column in ("samples/s", "staleness per worker", "overrun"):
            table.add_column(column, justify="right")
        ddp_time = systems.get("ddp", {}).get("time_to_target", {}).get("median", math.nan)
        for name, s in sorted(systems.items(), key=lambda item: item[1]["time_to_target"]["median"]):
            ttt, acc = s["time_to_target"], s.get("metric_at_budget", s["accuracy_at_budget"])
            faster = f" ({ddp_time / ttt['median']:.2f}×)" if math.isfinite(ttt["median"]) and name != "ddp" else ""
            table.add_row(
                name,
                f"{s['lr']:g}",
                _seconds(ttt["median"]) + (faster if math.isfinite(ddp_time) else ""),
                f"{_seconds(ttt['min'])}–{_seconds(ttt['max'])}",
                f"{s['reached']}/{ttt['n']}",
                f"{acc['median']:.4f}",
                f"{acc['min']:.4f}–{acc['max']:.4f}",
                f"{s['samples_per_second']['median']:.0f}",
                " ".join(f"{v:.1f}" for v in s["staleness_per_worker"]),
                f"{100 * s['overrun_fraction']:.0f}%",
            )
        console.print(table)
    if goals:
        print_targets(goals, console)


def plot_curves(runs: Sequence[RunResult], settings: RaceSettings, path: Path, metric: Metric = ACCURACY) -> None:
    """The screened metric (test accuracy unless told) against wall seconds, one panel per mix, the mean over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mixes = list(dict.fromkeys(mix_name(r.slowdowns) for r in runs))
    figure, axes = plt.subplots(1, len(mixes), figsize=(6.5 * len(mixes), 4.8), squeeze=False)
    for axis, mix in zip(axes[0], mixes, strict=True):
        by_system: dict[str, list[RunResult]] = {}
        for run in runs:
            if mix_name(run.slowdowns) == mix:
                by_system.setdefault(run.system, []).append(run)
        for system, seeds in by_system.items():
            length = min(len(r.curve) for r in seeds)
            times = [statistics.fmean(r.curve[i][0] for r in seeds) for i in range(length)]
            accuracy = [statistics.fmean(r.curve[i][1] for r in seeds) for i in range(length)]
            emphasis = {"ddp": ("black", 2.6), "bsp": ("tab:gray", 2.0)}.get(system)
            if emphasis:
                axis.plot(times, accuracy, label=system, color=emphasis[0], linewidth=emphasis[1])
            else:
                axis.plot(times, accuracy, label=system, linewidth=1.3)
        axis.axhline(settings.target, color="tab:red", linestyle=":", linewidth=1)
        axis.set_title(f"speeds {mix} ({len(next(iter(by_system.values())))} seed(s), mean)")
        axis.set_xlabel("wall seconds")
        if metric.higher_is_better:
            axis.set_ylabel("test accuracy (screened: every 10th test image)")
            axis.set_ylim(max(0.0, settings.target - 0.25), min(1.0, settings.target + 0.07))
        else:
            axis.set_ylabel(f"{metric.label} (screened: every 10th test example)")
            axis.set_ylim(max(0.0, settings.target - 0.3), settings.target + 1.5)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8, ncol=2, loc="lower right" if metric.higher_is_better else "upper right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
