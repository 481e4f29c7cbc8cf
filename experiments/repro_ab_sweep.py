"""Adaptive Braking at a constant delay of D = 32 over a learning-rate sweep, on one task.

The earlier AB reproduction tried one learning rate, at which every variant failed at D = 32;
a rule that helps at a large delay may need a smaller rate. Momentum ASGD and AB (α = 1, α = 2)
each run at every rate of a sweep at D = 32, and momentum ASGD also at D = 0 (the undelayed
reference). The verdict compares each variant at its own best rate with the best undelayed run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from experiments.repro_common import CONSTANT, Aggregates, Experiment, Point, beats, fmt, mean_of, std_of
from pstools.simulate import SimConfig

DELAY = 32
VARIANTS = ("momentum ASGD", "AB α=1", "AB α=2")
REFERENCE = "momentum ASGD, D=0"
LITTLE = 0.02  # "loses little": at most 2 points below the best undelayed run


@dataclass(frozen=True)
class SweepScale:
    """One task's sweep: the rates at D = 32, the rates of the D = 0 reference, the budget."""

    task: str
    task_words: str
    key: str
    lrs: tuple[float, ...]
    reference_lrs: tuple[float, ...]
    steps: int


DIGITS_SWEEP = SweepScale(
    "digits",
    "digits CNN",
    "ab32",
    (0.05, 0.02, 0.01, 0.005, 0.002, 0.001, 0.0005, 0.0002),
    (0.05, 0.01, 0.002, 0.0005),
    2000,
)
FASHION_SWEEP = SweepScale(
    "fashion", "Fashion-MNIST CNN", "ab32-fashion", (0.01, 0.003, 0.001, 0.0003, 0.0001), (0.01, 0.001), 400
)
QUICK_SWEEP = SweepScale("digits-mlp", "digits MLP", "ab32", (0.05, 0.005), (0.05,), 100)


def _options(variant: str, lr: float) -> tuple[str, dict[str, str]]:
    options = {"lr": f"{lr:g}", "momentum": "0.9"}
    if variant == "momentum ASGD":
        return "momentum", options
    if variant == "AB α=2":
        options["alpha"] = "2"
    return "adaptive-braking", options


def best_rate(agg: Aggregates, series: str) -> float:
    """The learning rate at which ``series`` reached its highest mean."""
    return max((x for s, x in agg if s == series), key=lambda x: mean_of(agg, series, x))


def ab_sweep_experiment(scale: SweepScale) -> Experiment:
    base = SimConfig(task=scale.task, steps=scale.steps, eval_every=scale.steps, speeds=CONSTANT)
    fashion = scale.task.startswith("fashion")
    points = []
    for variant in VARIANTS:
        for lr in scale.lrs:
            rule, options = _options(variant, lr)
            points.append(Point(variant, lr, replace(base, rule=rule, options=options, delay=DELAY)))
    for lr in scale.reference_lrs:
        options = _options("momentum ASGD", lr)[1]
        points.append(Point(REFERENCE, lr, replace(base, rule="momentum", options=options, delay=0)))

    def judge(agg: Aggregates) -> tuple[str, str]:
        ref_lr = best_rate(agg, REFERENCE)
        reference = mean_of(agg, REFERENCE, ref_lr)
        best = {v: best_rate(agg, v) for v in VARIANTS}
        drops = {v: reference - mean_of(agg, v, best[v]) for v in VARIANTS}
        edges = (min(scale.lrs), max(scale.lrs))
        parts = [
            f"{v} at its best rate {best[v]:g}{' (an end of the sweep)' if best[v] in edges else ''}: "
            f"{fmt(agg, v, best[v])}, {drops[v] * 100:.1f} points below"
            for v in VARIANTS
        ]
        mom = "momentum ASGD"
        ab_wins = []
        for v in VARIANTS[1:]:
            gap = mean_of(agg, v, best[v]) - mean_of(agg, mom, best[mom])
            spread = max(std_of(agg, v, best[v]) + std_of(agg, mom, best[mom]), 0.005)
            ab_wins.append(gap > spread)
        little = [v for v in VARIANTS[1:] if drops[v] <= LITTLE]
        mom_degrades = drops[mom] > LITTLE
        if little and any(ab_wins) and mom_degrades:
            verdict = "reproduced"
        elif any(ab_wins) or (little and not mom_degrades):
            verdict = "partly"
        else:
            verdict = "not reproduced"
        text = (
            f"The best undelayed run (momentum ASGD, D=0, lr {ref_lr:g}) reaches {fmt(agg, REFERENCE, ref_lr)}. "
            f"At D={DELAY}: " + "; ".join(parts) + ". "
            f"AB at its best rate is better than momentum ASGD at its best rate beyond the spread for "
            f"{', '.join(v for v, w in zip(VARIANTS[1:], ab_wins, strict=True) if w) or 'neither α'}; "
            f"momentum ASGD {'loses' if mom_degrades else 'does not lose'} more than {LITTLE * 100:.0f} points; "
            + (
                f"{' and '.join(little)} stay within {LITTLE * 100:.0f} points."
                if little
                else f"no AB variant stays within {LITTLE * 100:.0f} points."
            )
        )
        lines = [
            f"lr={lr:g}: " + ", ".join(f"{s} {fmt(agg, s, lr)}" for s in (*VARIANTS, REFERENCE) if (s, lr) in agg)
            for lr in sorted({x for _, x in agg}, reverse=True)
        ]
        # The comparison at one rate too: a rule that wins only at its own best rate is still a win.
        rates = [lr for lr in scale.lrs if all((v, lr) in agg for v in VARIANTS)]
        same = [lr for lr in rates if beats(agg, "AB α=1", mom, lr) == 1 or beats(agg, "AB α=2", mom, lr) == 1]
        text += f" AB (α=1 or 2) beats momentum ASGD at the same rate at lr in {[f'{x:g}' for x in same] or 'none'}."
        return verdict, text + "\n\n" + "\n".join(f"- {line}" for line in lines)

    return Experiment(
        scale.key,
        f"Adaptive Braking at D = {DELAY}: a learning-rate sweep" + (f" ({scale.task_words})" if fashion else ""),
        "Venigalla et al., 2020, Adaptive Braking for Mitigating Gradient Delay (reconstructed rule)",
        f"With a constant gradient delay D ≥ 32, momentum SGD with Adaptive Braking loses little final accuracy, "
        f"where plain momentum SGD degrades; each variant judged at its own best learning rate (here: within "
        f"{LITTLE * 100:.0f} points of the best undelayed run).",
        f"{scale.task_words}, constant-delay mode (every gradient applied exactly {DELAY} updates late), μ 0.9, "
        f"{scale.steps} gradients; lr in {{{', '.join(f'{x:g}' for x in scale.lrs)}}} at D={DELAY} for momentum ASGD "
        "and AB α=1, α=2; momentum ASGD at D=0 (one worker, no delay) with lr in "
        f"{{{', '.join(f'{x:g}' for x in scale.reference_lrs)}}} as the undelayed reference; final test accuracy.",
        "learning rate",
        points,
        judge,
        log_x=True,
        log_base=10,
        task="fashion" if fashion else "digits",
    )
