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
# label -> (rule, extra options, consistency); every other option is the task's, shared by all.
VARIANTS: dict[str, tuple[str, dict[str, str], str]] = {
    NAIVE: ("diloco", {}, "async"),
    DN: ("diloco-dn", {}, "async"),
    DN_DYLU: ("diloco-dn", {"dylu": "true"}, "async"),
    SYNC: ("diloco", {}, "bsp"),
}
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


TINYLM = LocalSgdScale(
    "tinylm",
    "tinylm (byte-level transformer, ~0.86M parameters, pydoc text)",
    steps=400,
    options={"lr": "0.7", "momentum": "0.9", "window": "10"},
    inner="AdamW (lr 0.003, weight decay 0.01, the task's own)",
    higher_is_better=False,
    metric_words="final validation loss",
    variant=" (tinylm byte-level transformer)",
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
)


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
    for x, mix in MIXES.items():
        dylu_vs_sync = beats(agg, DN_DYLU, SYNC, x, higher_is_better)
        naive_vs_sync = beats(agg, NAIVE, SYNC, x, higher_is_better)
        matches.append(dylu_vs_sync >= 0)
        lags.append(naive_vs_sync == -1)
        lines.append(
            f"speeds {mix}: DN + DyLU is {relation(dylu_vs_sync)} sync DiLoCo; "
            f"naive async DiLoCo is {relation(naive_vs_sync)} sync DiLoCo."
        )
        for series in VARIANTS:
            telemetry = agg[(series, x)].get("telemetry")
            steps = telemetry.get("local_steps") if isinstance(telemetry, dict) else None
            assigned = f"; mean assigned window {steps:.1f}" if series == DN_DYLU and steps else ""
            lines.append(f"  - {series}: {_value(agg, series, x, not higher_is_better)}{assigned}")
    if all(matches) and all(lags):
        verdict = "reproduced"
    elif any(matches) or any(lags):
        verdict = "partly"
    else:
        verdict = "not reproduced"
    summary = (
        f"DN + DyLU is within the seed spread of sync DiLoCo's final metric (or better) at {sum(matches)} of "
        f"{len(MIXES)} speed mixes; naive async DiLoCo lags sync DiLoCo beyond the spread at {sum(lags)} of "
        f"{len(MIXES)}."
    )
    return verdict, summary + "\n\n" + "\n".join(line if line.startswith("  ") else f"- {line}" for line in lines)


def local_sgd_experiment(scale: LocalSgdScale) -> Experiment:
    """The four DiLoCo variants on ``scale.task`` at both speed mixes."""
    opts = scale.options
    return Experiment(
        f"diloco-{scale.task}",
        "Async DiLoCo: naive vs Delayed Nesterov ± DyLU vs sync DiLoCo" + scale.variant,
        "Liu, Douillard et al., 2024, Asynchronous Local-SGD Training for Language Modeling (arXiv 2401.09135)",
        "On workers of different speeds, asynchronous DiLoCo with Delayed Nesterov outer momentum and Dynamic "
        "Local Updates matches synchronous DiLoCo's final loss, while naive asynchronous DiLoCo (outer Nesterov "
        "on every stale pseudo-gradient) lags.",
        f"{scale.words}, 4 workers with step times in the ratios 1:1:2:4 or 1:1:1:8 (x: the slowest worker's "
        f"slowdown), a budget of {scale.steps} gradients (all workers together); inner {scale.inner}, window "
        f"H = {opts['window']}, outer lr {opts['lr']} with Nesterov momentum {opts['momentum']}, the same for "
        "every variant; DN's period N = 4 (the worker count), c = 0; DyLU scales each window to the worker's "
        f"speed against the fastest (floor 1 step). Sync DiLoCo runs under BSP. Every variant gets the same "
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


def local_sgd_experiments(tasks: tuple[str, ...]) -> list[Experiment]:
    """The experiment of each of ``tasks`` that has one (``tinylm``, ``fashion``)."""
    return [local_sgd_experiment(s) for s in (TINYLM, FASHION) if s.task in tasks]
