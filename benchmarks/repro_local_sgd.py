"""The asynchronous Local-SGD reproduction: naive async DiLoCo vs Delayed Nesterov (± DyLU) vs sync DiLoCo.

Liu, Douillard et al., 2024, "Asynchronous Local-SGD Training for Language Modeling" (arXiv
2401.09135): with workers of different speeds, asynchronous DiLoCo whose server applies outer
Nesterov momentum on every stale pseudo-gradient lags synchronous DiLoCo; Delayed Nesterov
(momentum applied once per ``N`` pushes) with Dynamic Local Updates (each worker's window scaled
to its speed) matches synchronous DiLoCo's final loss. One experiment per task (``tinylm``, the
byte-level transformer with AdamW inner steps, and the ``fashion`` CNN with SGD inner steps),
speeds 1:1:2:4 and 1:1:1:8, every variant at the same inner rate, window and outer rate.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from benchmarks.repro_common import Aggregates, Experiment, Point, beats, mean_of, relation, std_of
from pstools.simulate import SimConfig, SpeedModel

SYNC = "sync DiLoCo (BSP)"
NAIVE = "async DiLoCo"
DN = "DN"
DN_DYLU = "DN + DyLU"
DN_DYLU_AT_ONCE = "DN + DyLU, pull at once"
# The reference scheduler's grace (the asyncdiloco notebook's max_wait_time, 0.5 s against steps of
# 0.58-3.33 s), in the simulator's step times: pushes that land within it are all applied before
# their workers pull (option pull_grace).
PULL_GRACE = "0.5"
# label -> (rule, extra options, consistency); every other option is the task's, shared by all.
VARIANTS: dict[str, tuple[str, dict[str, str], str]] = {
    NAIVE: ("diloco", {}, "async"),
    DN: ("diloco-dn", {"pull_grace": PULL_GRACE}, "async"),
    DN_DYLU: ("diloco-dn", {"dylu": "true", "pull_grace": PULL_GRACE}, "async"),
    DN_DYLU_AT_ONCE: ("diloco-dn", {"dylu": "true"}, "async"),
    SYNC: ("diloco", {}, "bsp"),
}
# x: the slowest worker's slowdown, which names the mix.
MIXES = {4.0: "1:1:2:4", 8.0: "1:1:1:8"}

# The limits check: DN + DyLU's gap to sync DiLoCo taken apart. label -> (rule, options over the
# task's, consistency, speed mix). "DN, equal speeds" has no speed difference for DyLU to remove,
# so what it lags sync DiLoCo by is the cost of asynchrony alone.
EQUAL = "DN, equal speeds"
# The same equal speeds with exponential step times: the pushes no longer arrive in lockstep, so
# what this series regains over EQUAL is the cost of four pushes landing at the same moment.
EQUAL_JITTER = "DN, equal speeds, random step times"
DYLU_FLOOR = "DN + DyLU, h_min 5"
DYLU_LOW_LR = "DN + DyLU, outer lr 0.35"
DYLU_HIGH_LR = "DN + DyLU, outer lr 1.0"
LIMIT_MIX = "1:1:2:4"
LIMIT_VARIANTS: dict[str, tuple[str, dict[str, str], str, str]] = {
    SYNC: ("diloco", {}, "bsp", LIMIT_MIX),
    EQUAL: ("diloco-dn", {}, "async", "1:1:1:1"),
    EQUAL_JITTER: ("diloco-dn", {}, "async", "exp:1:1:1:1"),
    DN: ("diloco-dn", {}, "async", LIMIT_MIX),
    DN_DYLU: ("diloco-dn", {"dylu": "true"}, "async", LIMIT_MIX),
    DYLU_FLOOR: ("diloco-dn", {"dylu": "true", "dylu_min": "5"}, "async", LIMIT_MIX),
    DYLU_LOW_LR: ("diloco-dn", {"dylu": "true", "lr": "0.35"}, "async", LIMIT_MIX),
    DYLU_HIGH_LR: ("diloco-dn", {"dylu": "true", "lr": "1.0"}, "async", LIMIT_MIX),
}
DYLU_VARIANTS = (DN_DYLU, DYLU_FLOOR, DYLU_LOW_LR, DYLU_HIGH_LR)


@dataclass(frozen=True)
class LocalSgdScale:
    """One task's set-up: budget, the shared DiLoCo options, and how the report names things."""

    task: str
    words: str
    steps: int
    options: dict[str, str]  # outer lr, momentum, window (and local_lr for SGD inner steps)
    inner: str  # the inner optimizer, in words
    higher_is_better: bool
    metric_words: str
    variant: str  # the title's ending, as the other tasks' variants have
    limit_budgets: tuple[int, ...] = ()  # the limits check's budgets in gradients (empty: no check)
    limit_series: tuple[str, ...] = ()  # its series, keys of LIMIT_VARIANTS


TINYLM = LocalSgdScale(
    "tinylm",
    "tinylm (byte-level transformer, ~0.86M parameters, pydoc text)",
    steps=400,
    options={"lr": "0.7", "momentum": "0.9", "window": "10"},
    inner="AdamW (lr 0.003, weight decay 0.01, the task's own)",
    higher_is_better=False,
    metric_words="final validation loss",
    variant=" (tinylm byte-level transformer)",
    limit_budgets=(400,),
    limit_series=(SYNC, EQUAL, EQUAL_JITTER, DN, DN_DYLU),
)
FASHION = LocalSgdScale(
    "fashion",
    "Fashion-MNIST CNN",
    steps=600,
    options={"lr": "0.7", "momentum": "0.9", "window": "10", "local_lr": "0.05"},
    inner="SGD (lr 0.05)",
    higher_is_better=True,
    metric_words="final test accuracy",
    variant=" (Fashion-MNIST CNN)",
    limit_budgets=(600, 2400),
    limit_series=(SYNC, EQUAL, DN, DN_DYLU, DYLU_FLOOR, DYLU_LOW_LR, DYLU_HIGH_LR),
)


PAPER = "Liu, Douillard et al., 2024, Asynchronous Local-SGD Training for Language Modeling (arXiv 2401.09135)"


def _judged(all_hold: bool, some_hold: bool, summary: str, lines: list[str]) -> tuple[str, str]:
    """The verdict (every check holds, some do, none) and the text: the summary, then ``lines`` as a list
    (lines starting with two spaces are sub-items)."""
    verdict = "reproduced" if all_hold else "partly" if some_hold else "not reproduced"
    return verdict, summary + "\n\n" + "\n".join(line if line.startswith("  ") else f"- {line}" for line in lines)


def _points(scale: LocalSgdScale) -> list[Point]:
    points = []
    for label, (rule, extra, consistency) in VARIANTS.items():
        for x, mix in MIXES.items():
            config = SimConfig(
                rule=rule,
                options={**scale.options, **extra},
                consistency=consistency,
                workers=4,
                speeds=SpeedModel.parse(mix),
                task=scale.task,
                steps=scale.steps,
                # Evaluate only at the end: the claim is about the final metric.
                eval_every=10 * scale.steps,
            )
            points.append(Point(label, x, config))
    return points


def _value(agg: Aggregates, series: str, x: float, loss: bool) -> str:
    mean, std = mean_of(agg, series, x), std_of(agg, series, x)
    if not loss:
        return f"{mean:.3f} ± {std:.3f}"
    ppl = math.exp(mean) if math.isfinite(mean) and mean < 700 else math.inf
    return f"{mean:.3f} ± {std:.3f} (perplexity {ppl:.4g})"


def judge_local_sgd(agg: Aggregates, higher_is_better: bool) -> tuple[str, str]:
    """Reproduced: at every mix DN + DyLU is within the spread of sync DiLoCo (or better) and naive
    async DiLoCo is worse than sync beyond the spread; partly: one of the two holds somewhere."""
    matches: list[bool] = []
    lags: list[bool] = []
    lines = []
    present = {s for s, _ in agg}
    for x, mix in MIXES.items():
        dylu_vs_sync = beats(agg, DN_DYLU, SYNC, x, higher_is_better)
        naive_vs_sync = beats(agg, NAIVE, SYNC, x, higher_is_better)
        matches.append(dylu_vs_sync >= 0)
        lags.append(naive_vs_sync == -1)
        at_once = (
            f" Pulling at once, DN + DyLU is {relation(beats(agg, DN_DYLU_AT_ONCE, SYNC, x, higher_is_better))} "
            "sync DiLoCo."
            if DN_DYLU_AT_ONCE in present
            else ""
        )
        lines.append(
            f"speeds {mix}: DN + DyLU is {relation(dylu_vs_sync)} sync DiLoCo; "
            f"naive async DiLoCo is {relation(naive_vs_sync)} sync DiLoCo.{at_once}"
        )
        for series in VARIANTS:
            if series not in present:
                continue
            telemetry = agg[(series, x)].get("telemetry")
            steps = telemetry.get("local_steps") if isinstance(telemetry, dict) else None
            assigned = f"; mean assigned window {steps:.1f}" if series in (DN_DYLU, DN_DYLU_AT_ONCE) and steps else ""
            lines.append(f"  - {series}: {_value(agg, series, x, not higher_is_better)}{assigned}")
    summary = (
        f"DN + DyLU is within the seed spread of sync DiLoCo's final metric (or better) at {sum(matches)} of "
        f"{len(MIXES)} speed mixes; naive async DiLoCo lags sync DiLoCo beyond the spread at {sum(lags)} of "
        f"{len(MIXES)}."
    )
    return _judged(all(matches) and all(lags), any(matches) or any(lags), summary, lines)


def local_sgd_experiment(scale: LocalSgdScale) -> Experiment:
    """The four DiLoCo variants on ``scale.task`` at both speed mixes."""
    opts = scale.options
    return Experiment(
        f"diloco-{scale.task}",
        "Async DiLoCo: naive vs Delayed Nesterov ± DyLU vs sync DiLoCo" + scale.variant,
        PAPER,
        "On workers of different speeds, asynchronous DiLoCo with Delayed Nesterov outer momentum and Dynamic "
        "Local Updates matches synchronous DiLoCo's final loss, while naive asynchronous DiLoCo (outer Nesterov "
        "on every stale pseudo-gradient) lags.",
        f"{scale.words}, 4 workers with step times in the ratios 1:1:2:4 or 1:1:1:8 (x: the slowest worker's "
        f"slowdown), a budget of {scale.steps} gradients (all workers together); inner {scale.inner}, window "
        f"H = {opts['window']}, outer lr {opts['lr']} with Nesterov momentum {opts['momentum']}, the same for "
        "every variant; DN's period N = 4 (the worker count), c = 0; DyLU scales each window to the worker's "
        "speed against the fastest (floor 1 step). DN runs with the paper's scheduler: pushes that land within "
        f"pull_grace = {PULL_GRACE} step times of each other are all applied before their workers pull (the "
        'reference notebook\'s max_wait_time); "pull at once" is DN + DyLU without it, each worker pulling '
        "right after its own push. Sync DiLoCo runs under BSP. Every variant gets the same "
        "gradient budget (same compute); sync DiLoCo spends more virtual time on it, every round waiting for the "
        f"slowest worker. Metric: {scale.metric_words}"
        + (" (lower is better; the perplexity given is exp of the mean loss)." if not scale.higher_is_better else "."),
        "slowest worker's slowdown",
        _points(scale),
        lambda agg: judge_local_sgd(agg, scale.higher_is_better),
        metric="metric_value",
        log_x=False,
        task=scale.task,
        metric_label=f"{scale.metric_words} (mean ± std over seeds)",
        log_y=not scale.higher_is_better,
    )


def _limit_points(scale: LocalSgdScale) -> list[Point]:
    series = scale.limit_series
    points = []
    for label in series:
        rule, extra, consistency, mix = LIMIT_VARIANTS[label]
        for budget in scale.limit_budgets:
            config = SimConfig(
                rule=rule,
                options={**scale.options, **extra},
                consistency=consistency,
                workers=4,
                speeds=SpeedModel.parse(mix),
                task=scale.task,
                steps=budget,
                eval_every=10 * budget,
            )
            points.append(Point(label, float(budget), config))
    return points


def judge_limits(agg: Aggregates, higher_is_better: bool) -> tuple[str, str]:
    """Reproduced (the diagnosis holds): at every budget DN on equal speeds lags sync DiLoCo beyond
    the spread, and DN + DyLU on mixed speeds is within the spread of it (or better), so asynchrony
    alone accounts for the gap; partly: asynchrony alone lags somewhere; not reproduced: never."""
    budgets = sorted({x for s, x in agg if s == SYNC})
    present = {s for s, _ in agg}
    alone: list[bool] = []
    accounted: list[bool] = []
    lines = []
    for x in budgets:
        equal_vs_sync = beats(agg, EQUAL, SYNC, x, higher_is_better)
        dylu_vs_equal = beats(agg, DN_DYLU, EQUAL, x, higher_is_better)
        alone.append(equal_vs_sync == -1)
        accounted.append(dylu_vs_equal >= 0)
        lines.append(
            f"{x:.0f} gradients: DN on equal speeds is {relation(equal_vs_sync)} sync DiLoCo; "
            f"DN + DyLU on {LIMIT_MIX} is {relation(dylu_vs_equal)} DN on equal speeds."
        )
        dylu = [s for s in DYLU_VARIANTS if s in present]
        best = max(dylu, key=lambda s: mean_of(agg, s, x) * (1 if higher_is_better else -1))
        lines.append(
            f"  - the best DN + DyLU setting, {best}, is {relation(beats(agg, best, SYNC, x, higher_is_better))} "
            "sync DiLoCo"
        )
        for series in LIMIT_VARIANTS:
            if series in present:
                lines.append(f"  - {series}: {_value(agg, series, x, not higher_is_better)}")
    summary = (
        f"Asynchrony alone (DN on equal speeds) lags sync DiLoCo beyond the spread at {sum(alone)} of "
        f"{len(budgets)} budgets; DN + DyLU on mixed speeds does as well as it (within the spread or better) "
        f"at {sum(accounted)} of {len(budgets)}."
    )
    return _judged(all(alone) and all(accounted), any(alone), summary, lines)


def limits_experiment(scale: LocalSgdScale) -> Experiment:
    """What keeps DN + DyLU from sync DiLoCo on ``scale.task``: asynchrony alone, DyLU's floor, the outer rate."""
    opts = scale.options
    budgets = " and ".join(str(b) for b in scale.limit_budgets)
    return Experiment(
        f"diloco-limits-{scale.task}",
        "What keeps DN + DyLU from sync DiLoCo" + scale.variant,
        PAPER,
        "A diagnosis of the section above, not a claim of the paper: DN + DyLU's gap to sync DiLoCo is the "
        "cost of asynchrony itself (workers computing from parameters the other pushes have not finished "
        "moving), which Delayed Nesterov on workers of equal speed, where DyLU has nothing to do, pays too; "
        "DyLU's floor and the outer rate do not close it.",
        f"{scale.words}; as above (window H = {opts['window']}, outer Nesterov momentum {opts['momentum']}, "
        f"outer lr {opts['lr']} unless the series says otherwise, DN's N = 4, c = 0), at budgets of {budgets} "
        f'gradients (the x axis). Sync DiLoCo and every DN + DyLU series run at {LIMIT_MIX}; "DN, equal '
        'speeds" runs Delayed Nesterov asynchronously at 1:1:1:1 (every worker as fast as the fastest). '
        + (
            '"Random step times" draws each step\'s time from an exponential distribution of the same mean, so the '
            "equal-speed workers' pushes stop arriving in lockstep. "
            if EQUAL_JITTER in scale.limit_series
            else ""
        )
        + (
            '"h_min 5" keeps every assigned window at least 5 steps (the paper\'s notebook floors a quarter of '
            "the window); the outer-lr series move only the outer rate. "
            if DYLU_FLOOR in scale.limit_series
            else ""
        )
        + f"Metric: {scale.metric_words}"
        + (" (lower is better)." if not scale.higher_is_better else "."),
        "budget (gradients, all workers)",
        _limit_points(scale),
        lambda agg: judge_limits(agg, scale.higher_is_better),
        metric="metric_value",
        log_x=False,
        task=scale.task,
        metric_label=f"{scale.metric_words} (mean ± std over seeds)",
        log_y=not scale.higher_is_better,
    )


def local_sgd_experiments(tasks: tuple[str, ...]) -> list[Experiment]:
    """Each of ``tasks``' experiments (``tinylm``, ``fashion``): the reproduction, then its limits check."""
    built = []
    for scale in (TINYLM, FASHION):
        if scale.task in tasks:
            built.append(local_sgd_experiment(scale))
            if scale.limit_budgets:
                built.append(limits_experiment(scale))
    return built
