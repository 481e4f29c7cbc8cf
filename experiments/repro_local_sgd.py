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

from experiments.repro_common import Aggregates, Experiment, Point, beats, mean_of, relation, std_of
from pstools.simulate import SimConfig, SpeedModel

SYNC = "sync DiLoCo (BSP)"
NAIVE = "async DiLoCo"
DN = "DN"
DN_DYLU = "DN + DyLU"
DN_DYLU_NOTEBOOK_GRACE = "DN + DyLU, grace 0.5"
DN_DYLU_AT_ONCE = "DN + DyLU, pull at once"
# DN's scheduler (option pull_grace, in the simulator's step times): pushes that land within it of
# each other are all applied before their workers pull. This one covers DyLU's rounding: a worker
# assigned floor(v / v_max · H) steps ends its window up to one of its own steps before the
# fastest worker's H, and at these mixes (H = 10: windows of 10, 10, 5 and 2 steps at 1:1:2:4,
# 10, 10, 10 and 1 at 1:1:1:8) the slowest worker ends 2 step times early.
PULL_GRACE = "2.0"
# The reference scheduler's own grace (the asyncdiloco notebook's max_wait_time, 0.5 s against
# steps of 0.58-3.33 s and windows of 10.6-16.7 s), which lines up only windows that end within
# half a step of each other.
NOTEBOOK_GRACE = "0.5"
# label -> (rule, extra options, consistency); every other option is the task's, shared by all.
VARIANTS: dict[str, tuple[str, dict[str, str], str]] = {
    NAIVE: ("diloco", {}, "async"),
    DN: ("diloco-dn", {"pull_grace": PULL_GRACE}, "async"),
    DN_DYLU: ("diloco-dn", {"dylu": "true", "pull_grace": PULL_GRACE}, "async"),
    DN_DYLU_NOTEBOOK_GRACE: ("diloco-dn", {"dylu": "true", "pull_grace": NOTEBOOK_GRACE}, "async"),
    DN_DYLU_AT_ONCE: ("diloco-dn", {"dylu": "true"}, "async"),
    SYNC: ("diloco", {}, "bsp"),
}
# The longer-budget check runs only what the claim compares, and the notebook's grace beside it.
LONG_SERIES = (SYNC, DN_DYLU, DN_DYLU_NOTEBOOK_GRACE)
# x: the slowest worker's slowdown, which names the mix.
MIXES = {4.0: "1:1:2:4", 8.0: "1:1:1:8"}


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
    long_steps: int | None = None  # the longer-budget check's budget in gradients (None: no check)


TINYLM = LocalSgdScale(
    "tinylm",
    "tinylm (byte-level transformer, ~0.86M parameters, pydoc text)",
    steps=400,
    options={"lr": "0.7", "momentum": "0.9", "window": "10"},
    inner="AdamW (lr 0.003, weight decay 0.01, the task's own)",
    higher_is_better=False,
    metric_words="final validation loss",
    variant=" (tinylm byte-level transformer)",
    long_steps=1600,
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
    long_steps=2400,
)


PAPER = "Liu, Douillard et al., 2024, Asynchronous Local-SGD Training for Language Modeling (arXiv 2401.09135)"


def _judged(all_hold: bool, some_hold: bool, summary: str, lines: list[str]) -> tuple[str, str]:
    """The verdict (every check holds, some do, none) and the text: the summary, then ``lines`` as a list
    (lines starting with two spaces are sub-items)."""
    verdict = "reproduced" if all_hold else "partly" if some_hold else "not reproduced"
    return verdict, summary + "\n\n" + "\n".join(line if line.startswith("  ") else f"- {line}" for line in lines)


def _points(scale: LocalSgdScale, series: tuple[str, ...], steps: int) -> list[Point]:
    points = []
    for label in series:
        rule, extra, consistency = VARIANTS[label]
        for x, mix in MIXES.items():
            config = SimConfig(
                rule=rule,
                options={**scale.options, **extra},
                consistency=consistency,
                workers=4,
                speeds=SpeedModel.parse(mix),
                task=scale.task,
                steps=steps,
                # Evaluate only at the end: the claim is about the final metric.
                eval_every=10 * steps,
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
        at_once = "".join(
            f" {words}, DN + DyLU is {relation(beats(agg, series, SYNC, x, higher_is_better))} sync DiLoCo."
            for series, words in (
                (DN_DYLU_NOTEBOOK_GRACE, "With the notebook's grace"),
                (DN_DYLU_AT_ONCE, "Pulling at once"),
            )
            if series in present
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
            assigned = f"; mean assigned window {steps:.1f}" if "DyLU" in series and steps else ""
            lines.append(f"  - {series}: {_value(agg, series, x, not higher_is_better)}{assigned}")
    summary = (
        f"DN + DyLU is within the seed spread of sync DiLoCo's final metric (or better) at {sum(matches)} of "
        f"{len(MIXES)} speed mixes; naive async DiLoCo lags sync DiLoCo beyond the spread at {sum(lags)} of "
        f"{len(MIXES)}."
    )
    return _judged(all(matches) and all(lags), any(matches) or any(lags), summary, lines)


def local_sgd_experiment(scale: LocalSgdScale) -> Experiment:
    """Every DiLoCo variant on ``scale.task`` at both speed mixes."""
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
        "speed against the fastest (floor 1 step). DN runs with a pull grace: pushes that land within "
        f"pull_grace = {PULL_GRACE} step times of each other are all applied before their workers pull (the "
        "scheduler of the paper's reference notebook), a grace that covers DyLU's rounding (the slowest worker's "
        'rounded window ends 2 step times before the fastest\'s 10 at both mixes); "grace 0.5" is the '
        f"notebook's own max_wait_time ({NOTEBOOK_GRACE}, which at its step times lines up only windows ending "
        'within half a step of each other); "pull at once" is DN + DyLU without a grace, each worker pulling '
        "right after its own push. Sync DiLoCo runs under BSP. Every variant gets the same "
        "gradient budget (same compute); sync DiLoCo spends more virtual time on it, every round waiting for the "
        f"slowest worker. Metric: {scale.metric_words}"
        + (" (lower is better; the perplexity given is exp of the mean loss)." if not scale.higher_is_better else "."),
        "slowest worker's slowdown",
        _points(scale, tuple(VARIANTS), scale.steps),
        lambda agg: judge_local_sgd(agg, scale.higher_is_better),
        metric="metric_value",
        log_x=False,
        task=scale.task,
        metric_label=f"{scale.metric_words} (mean ± std over seeds)",
        log_y=not scale.higher_is_better,
    )


def judge_longer_budget(agg: Aggregates, higher_is_better: bool) -> tuple[str, str]:
    """Reproduced: at every mix DN + DyLU is within the spread of sync DiLoCo (or better); partly: at some."""
    matches: list[bool] = []
    lines = []
    present = {s for s, _ in agg}
    for x, mix in MIXES.items():
        outcome = beats(agg, DN_DYLU, SYNC, x, higher_is_better)
        matches.append(outcome >= 0)
        notebook = (
            f" With the notebook's grace it is "
            f"{relation(beats(agg, DN_DYLU_NOTEBOOK_GRACE, SYNC, x, higher_is_better))} sync DiLoCo."
            if DN_DYLU_NOTEBOOK_GRACE in present
            else ""
        )
        lines.append(f"speeds {mix}: DN + DyLU is {relation(outcome)} sync DiLoCo.{notebook}")
        lines.extend(f"  - {s}: {_value(agg, s, x, not higher_is_better)}" for s in LONG_SERIES if s in present)
    summary = (
        f"At the longer budget DN + DyLU is within the seed spread of sync DiLoCo's final metric (or better) at "
        f"{sum(matches)} of {len(MIXES)} speed mixes."
    )
    return _judged(all(matches), any(matches), summary, lines)


def longer_budget_experiment(scale: LocalSgdScale, steps: int) -> Experiment:
    """DN + DyLU against sync DiLoCo on ``scale.task`` at ``steps`` gradients, both mixes."""
    return Experiment(
        f"diloco-long-{scale.task}",
        f"DN + DyLU vs sync DiLoCo at {steps} gradients" + scale.variant,
        PAPER,
        "The claim of the section above at a budget four times as long, nearer the paper's setting (its claim is "
        "on the final perplexity after full training): DN + DyLU matches synchronous DiLoCo's final metric.",
        f"As the section above (the same options, pull_grace {PULL_GRACE} for DN + DyLU and the notebook's "
        f"{NOTEBOOK_GRACE} beside it), at a budget of {steps} gradients. Metric: {scale.metric_words}"
        + (" (lower is better)." if not scale.higher_is_better else "."),
        "slowest worker's slowdown",
        _points(scale, LONG_SERIES, steps),
        lambda agg: judge_longer_budget(agg, scale.higher_is_better),
        metric="metric_value",
        log_x=False,
        task=scale.task,
        metric_label=f"{scale.metric_words} (mean ± std over seeds)",
        log_y=not scale.higher_is_better,
    )


def local_sgd_experiments(tasks: tuple[str, ...]) -> list[Experiment]:
    """Each of ``tasks``' experiments (``tinylm``, ``fashion``): the reproduction, then its longer budget."""
    built = []
    for scale in (TINYLM, FASHION):
        if scale.task in tasks:
            built.append(local_sgd_experiment(scale))
            if scale.long_steps is not None:
                built.append(longer_budget_experiment(scale, scale.long_steps))
    return built
