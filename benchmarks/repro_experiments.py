"""The reproductions: one experiment per paper claim, as simulator configurations and a verdict.

Each :class:`Experiment` lists its series (a rule with its options) over an x axis (workers,
delay, ...). Every point runs for several seeds; :mod:`benchmarks.reproduce` runs them,
aggregates mean ± std and asks the experiment's ``judge`` for a verdict in plain words.
Scales (steps per run, grids) are chosen so the full set fits an hour on two CPU cores;
``quick`` keeps a tiny subset for the smoke test.
"""

from __future__ import annotations

import itertools
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
    metric: str = "test_accuracy"  # or "time_to_target_s"
    log_x: bool = True
    extra_plot: str | None = None  # a telemetry key plotted beside the metric
    notes: list[str] = field(default_factory=list)


def as_float(value: object) -> float:
    """An aggregate's number (``Aggregates`` values are typed ``object``)."""
    assert isinstance(value, float)
    return value


def _mean(agg: Aggregates, series: str, x: float) -> float:
    value = agg[(series, x)]["mean"]
    assert isinstance(value, float)
    return value


def _std(agg: Aggregates, series: str, x: float) -> float:
    value = agg[(series, x)]["std"]
    assert isinstance(value, float)
    return value


def _xs(agg: Aggregates, series: str) -> list[float]:
    return sorted(x for s, x in agg if s == series)


def _beats(agg: Aggregates, a: str, b: str, x: float) -> int:
    """+1 when a's mean beats b's by more than both spreads, −1 the other way, 0 within the spread."""
    gap = _mean(agg, a, x) - _mean(agg, b, x)
    spread = max(_std(agg, a, x) + _std(agg, b, x), 0.005)
    return 1 if gap > spread else -1 if gap < -spread else 0


def _relation(outcome: int) -> str:
    return "better than" if outcome == 1 else "worse than" if outcome == -1 else "within the spread of"


def _fmt(agg: Aggregates, series: str, x: float) -> str:
    return f"{_mean(agg, series, x):.3f} ± {_std(agg, series, x):.3f}"


def _grid(series: list[Series], xs: list[int], axis: str) -> list[Point]:
    points = []
    for s in series:
        for x in xs:
            config = replace(s.config, delay=x) if axis == "delay" else replace(s.config, workers=x)
            points.append(Point(s.label, float(x), config))
    return points


# -- AGN ----------------------------------------------------------------------------------


def agn_experiment(quick: bool) -> Experiment:
    ns, windows, steps = ([5, 20], [1, 10], 300) if quick else ([5, 10, 20, 40], [1, 5, 10, 20], 3000)
    points = []
    for lam in windows:
        for n in ns:
            base = SimConfig(workers=n, speeds=EXP, task="digits-mlp", steps=steps, eval_every=steps)
            for label, rule, lr in (("AGN", "agn", "0.002"), ("DynSGD", "dynsgd", "0.05"), ("EASGD", "easgd", "0.05")):
                options = {"lr": lr, "window": str(lam)}
                points.append(Point(f"{label} λ={lam}", float(n), replace(base, rule=rule, options=options)))

    def judge(agg: Aggregates) -> tuple[str, str]:
        wins = losses = ties = 0
        lines = []
        for lam in windows:
            for n in ns:
                a, d, e = f"AGN λ={lam}", f"DynSGD λ={lam}", f"EASGD λ={lam}"
                against = [_beats(agg, a, d, n), _beats(agg, a, e, n)]
                wins += against.count(1)
                losses += against.count(-1)
                ties += against.count(0)
                lines.append(
                    f"n={n}, λ={lam}: AGN {_fmt(agg, a, n)}, DynSGD {_fmt(agg, d, n)}, EASGD {_fmt(agg, e, n)}"
                )
        total = wins + losses + ties
        verdict = "reproduced" if wins >= 0.75 * total else "partly" if wins > losses else "not reproduced"
        text = (
            f"Over {total} comparisons (AGN against DynSGD and against EASGD at each n and λ), AGN is better "
            f"beyond the seed spread in {wins}, worse in {losses}, and within the spread in {ties}."
        )
        return verdict, text + "\n\n" + "\n".join(f"- {line}" for line in lines)

    return Experiment(
        "agn",
        "AGN vs DynSGD vs asynchronous EASGD",
        "Hermans et al., 2017, Accumulated Gradient Normalization",
        "AGN converges better than asynchronous EASGD and DynSGD (MNIST MLP, n = 20–40 workers, λ = 20); "
        "it loses when λ ≪ n.",
        f"digits MLP, exponential step times (mean 1), a fixed budget of {steps} gradients (all workers "
        "together, batch 32) split over n workers; AGN with local Adam (lr 0.002), DynSGD and EASGD with "
        "local SGD (lr 0.05, ρ = 5); final test accuracy.",
        "workers n",
        points,
        judge,
    )


# -- Adaptive Braking ---------------------------------------------------------------------------


def ab_experiment(quick: bool) -> Experiment:
    delays, steps, task = ([0, 8], 200, "digits-mlp") if quick else ([0, 8, 32], 2000, "digits")
    base = SimConfig(task=task, steps=steps, eval_every=steps, speeds=CONSTANT)
    lr, mu = "0.05", "0.9"
    series = [
        Series("momentum ASGD", replace(base, rule="momentum", options={"lr": lr, "momentum": mu})),
        Series("AB α=1", replace(base, rule="adaptive-braking", options={"lr": lr, "momentum": mu})),
        Series("AB α=2", replace(base, rule="adaptive-braking", options={"lr": lr, "momentum": mu, "alpha": "2"})),
        Series(
            "AB sign-flipped",
            replace(base, rule="adaptive-braking", options={"lr": lr, "momentum": mu, "flip_sign": "true"}),
        ),
    ]

    def judge(agg: Aggregates) -> tuple[str, str]:
        big = max(delays)
        lines = [
            f"D={int(d)}: " + ", ".join(f"{s.label} {_fmt(agg, s.label, d)}" for s in series)
            for d in map(float, delays)
        ]
        ab_drop = _mean(agg, "AB α=1", 0.0) - _mean(agg, "AB α=1", float(big))
        mom_drop = _mean(agg, "momentum ASGD", 0.0) - _mean(agg, "momentum ASGD", float(big))
        better = _beats(agg, "AB α=1", "momentum ASGD", float(big))
        flip_worse = _beats(agg, "AB α=1", "AB sign-flipped", float(big)) == 1
        helped = [int(d) for d in delays if d and _beats(agg, "AB α=1", "momentum ASGD", float(d)) == 1]
        verdict = "reproduced" if better == 1 and ab_drop < 0.02 else "partly" if helped else "not reproduced"
        text = (
            f"At D={big}, AB (α=1) loses {ab_drop * 100:.1f} points against its D=0 accuracy, momentum ASGD "
            f"loses {mom_drop * 100:.1f}; AB is {_relation(better)} momentum ASGD there. AB (α=1) beats momentum "
            f"ASGD beyond the spread at D in {helped or 'none'}; the sign-flipped variant is "
            f"{'worse than AB' if flip_worse else 'not worse than AB beyond the spread'} at D={big}."
        )
        return verdict, text + "\n\n" + "\n".join(f"- {line}" for line in lines)

    return Experiment(
        "ab",
        "Adaptive Braking vs momentum ASGD under constant delay",
        "Venigalla et al., 2020, Adaptive Braking for Mitigating Gradient Delay (reconstructed rule)",
        "With a constant gradient delay D ≥ 32, momentum SGD with Adaptive Braking loses little final "
        "accuracy, where plain momentum SGD degrades.",
        f"{'digits CNN' if task == 'digits' else 'digits MLP'}, constant-delay mode (every gradient applied "
        f"exactly D updates late), lr 0.05, μ 0.9, {steps} gradients; final test accuracy.",
        "delay D",
        _grid(series, delays, "delay"),
        judge,
        log_x=False,
    )


# -- Gap-Aware ------------------------------------------------------------------------------------


def ga_experiment(quick: bool) -> Experiment:
    ns, steps = ([4, 16], 200) if quick else ([4, 8, 16, 32, 64], 2000)
    base = SimConfig(task="digits-mlp", steps=steps, eval_every=steps, speeds=EXP)
    series = [
        Series("ASGD", replace(base, rule="asgd", options={"lr": "0.2"})),
        Series("SA", replace(base, rule="sa", options={"lr": "0.2"})),
        Series("GA", replace(base, rule="gap-aware", options={"lr": "0.2"})),
        Series("momentum ASGD", replace(base, rule="momentum", options={"lr": "0.02", "momentum": "0.9"})),
        Series("GA + momentum", replace(base, rule="gap-aware", options={"lr": "0.02", "momentum": "0.9"})),
    ]
    if quick:
        series = series[1:3]

    def judge(agg: Aggregates) -> tuple[str, str]:
        lines = [
            f"n={int(n)}: " + ", ".join(f"{s.label} {_fmt(agg, s.label, n)}" for s in series) for n in map(float, ns)
        ]
        vs_sa = [_beats(agg, "GA", "SA", float(n)) for n in ns]
        gaps = [_mean(agg, "GA", float(n)) - _mean(agg, "SA", float(n)) for n in ns]
        growing = gaps[-1] > gaps[0]
        text = (
            f"GA vs SA (GA − SA): {', '.join(f'n={n}: {g * 100:+.1f} pts' for n, g in zip(ns, gaps, strict=True))}; "
            f"GA is better beyond the spread at {vs_sa.count(1)} of {len(ns)} sizes, worse at {vs_sa.count(-1)}."
        )
        momentum_ok = True
        if "GA + momentum" in {s.label for s in series}:
            big = float(ns[-1])
            helps = _beats(agg, "GA + momentum", "GA", big)
            momentum_ok = helps >= 0
            text += (
                f" At n={ns[-1]}, GA with momentum is {_relation(helps)} "
                f"GA without ({_fmt(agg, 'GA + momentum', big)} vs {_fmt(agg, 'GA', big)}), and against naive momentum "
                f"ASGD {_fmt(agg, 'momentum ASGD', big)}."
            )
        wins = vs_sa.count(1)
        verdict = (
            "reproduced"
            if wins >= len(ns) - 1 and growing and momentum_ok
            else "partly"
            if wins > vs_sa.count(-1) or (growing and gaps[-1] > 0)
            else "not reproduced"
        )
        return verdict, text + "\n\n" + "\n".join(f"- {line}" for line in lines)

    return Experiment(
        "ga",
        "Gap-Aware vs staleness-aware (SA) vs ASGD, with and without momentum",
        "Barkai, Hakimi & Schuster, ICLR 2020, Gap-Aware Mitigation of Gradient Staleness (reconstructed rule)",
        "GA beats SA in final accuracy, more so as workers grow; with GA, momentum helps even with many workers.",
        f"digits MLP, exponential step times (mean 1, so τ ≈ n − 1), {steps} gradients; SGD rules at lr 0.2, "
        "momentum rules at lr 0.02 with μ 0.9; final test accuracy.",
        "workers n",
        _grid(series, ns, "workers"),
        judge,
        extra_plot="scale",
    )


# -- GEM ----------------------------------------------------------------------------------------


def gem_experiment(quick: bool) -> Experiment:
    ns, steps, lrs, task = (
        ([5, 20], 200, ["0.05"], "digits-mlp") if quick else ([5, 10, 20, 50, 100], 2000, ["0.05", "0.1"], "digits")
    )
    series = []
    for lr in lrs:
        base = SimConfig(task=task, steps=steps, eval_every=steps, speeds=EXP)
        series += [
            Series(f"GEM η={lr}", replace(base, rule="gem", options={"lr": lr, "momentum": "0.9"})),
            Series(f"DOWNPOUR η={lr}", replace(base, rule="downpour", options={"lr": lr, "window": "1"})),
            Series(f"1/(τ+1) η={lr}", replace(base, rule="dynsgd", options={"lr": lr, "window": "1"})),
        ]

    def judge(agg: Aggregates) -> tuple[str, str]:
        lines = [
            f"n={int(n)}: " + ", ".join(f"{s.label} {_fmt(agg, s.label, n)}" for s in series) for n in map(float, ns)
        ]
        big = float(ns[-1])
        gem = f"GEM η={lrs[0]}"
        drop_gem = _mean(agg, gem, float(ns[0])) - _mean(agg, gem, big)
        drop_dp = _mean(agg, f"DOWNPOUR η={lrs[0]}", float(ns[0])) - _mean(agg, f"DOWNPOUR η={lrs[0]}", big)
        pis = []
        for n in ns:
            tele = agg[(gem, float(n))]["telemetry"]
            assert isinstance(tele, dict)
            pis.append(tele.get("pi_median", float("nan")))
        pi_falls = all(b <= a + 1e-9 for a, b in itertools.pairwise(pis))
        text = (
            f"From n={ns[0]} to n={ns[-1]} at η={lrs[0]}: GEM's accuracy changes by {-drop_gem * 100:+.1f} points, "
            f"DOWNPOUR's by {-drop_dp * 100:+.1f}. Median π: "
            + ", ".join(f"n={n}: {p:.3f}" for n, p in zip(ns, pis, strict=True))
            + f" ({'falls' if pi_falls else 'does not fall monotonically'} as workers are added)."
        )
        stable = drop_gem < 0.02
        degrades = drop_dp > drop_gem + 0.01
        high_lr_ok = True
        if len(lrs) > 1:
            hi = lrs[-1]
            g, d = _mean(agg, f"GEM η={hi}", big), _mean(agg, f"DOWNPOUR η={hi}", big)
            dd = agg[(f"DOWNPOUR η={hi}", big)]["diverged"]
            text += f" At η={hi} and n={ns[-1]}: GEM {g:.3f}, DOWNPOUR {d:.3f} (diverged in {dd} of the seeds)."
            high_lr_ok = g > d + 0.05
        verdict = (
            "reproduced"
            if stable and degrades and pi_falls and high_lr_ok
            else "partly"
            if stable or pi_falls or degrades
            else "not reproduced"
        )
        return verdict, text + "\n\n" + "\n".join(f"- {line}" for line in lines)

    return Experiment(
        "gem",
        "GEM vs DOWNPOUR vs 1/(τ+1) as workers grow",
        "Hermans & Louppe, 2018, Gradient Energy Matching",
        "GEM stays stable where DOWNPOUR degrades as workers are added (up to 100 workers); the median π "
        "falls as workers are added; at η = 0.1 DOWNPOUR fails and GEM converges.",
        f"{'digits CNN' if task == 'digits' else 'digits MLP'}, exponential step times, {steps} gradients; "
        "GEM with μ 0.9, κ 1 (atomic pull-and-commit); DOWNPOUR and the 1/(τ+1) rule (DynSGD) push every "
        "step; final test accuracy.",
        "workers n",
        _grid(series, ns, "workers"),
        judge,
        extra_plot="pi_median",
    )


# -- OrMo -----------------------------------------------------------------------------------------


def ormo_experiment(quick: bool) -> Experiment:
    ks, steps = ([4], 200) if quick else ([4, 16, 64], 2000)
    points = []
    eta, beta = 0.01, "0.9"
    for speeds, tag in ((CONSTANT, "homogeneous"), (HETERO, "1:1:2:4")):
        for k in ks:
            base = SimConfig(task="digits-mlp", steps=steps, eval_every=steps, speeds=speeds, workers=k)
            rows = [
                ("OrMo", replace(base, rule="ormo", options={"lr": str(eta), "beta": beta})),
                ("ASGD", replace(base, rule="asgd", options={"lr": str(eta / (1 - 0.9))})),
                ("momentum ASGD", replace(base, rule="momentum", options={"lr": str(eta), "momentum": beta})),
                (
                    "sync momentum SGD",
                    replace(base, rule="momentum", consistency="bsp", options={"lr": f"{eta * k:g}", "momentum": beta}),
                ),
            ]
            if quick:
                rows = rows[:1] + rows[2:3]
            points += [Point(f"{label} ({tag})", float(k), config) for label, config in rows]

    def judge(agg: Aggregates) -> tuple[str, str]:
        labels = sorted({s for s, _ in agg})
        lines = [f"K={int(k)}: " + ", ".join(f"{s} {_fmt(agg, s, float(k))}" for s in labels) for k in ks]
        score = {"win": 0, "loss": 0, "tie": 0}
        for tag in ("homogeneous", "1:1:2:4"):
            for k in ks:
                for other in ("ASGD", "momentum ASGD"):
                    if (f"{other} ({tag})", float(k)) not in agg:
                        continue
                    b = _beats(agg, f"OrMo ({tag})", f"{other} ({tag})", float(k))
                    score["win" if b == 1 else "loss" if b == -1 else "tie"] += 1
        total = sum(score.values())
        verdict = (
            "reproduced"
            if score["win"] >= 0.75 * total
            else "partly"
            if score["win"] > score["loss"]
            else "not reproduced"
        )
        text = (
            f"OrMo against ASGD and naive momentum ASGD, at every K and both speed mixes ({total} comparisons): "
            f"better beyond the seed spread in {score['win']}, worse in {score['loss']}, within the spread in "
            f"{score['tie']}. Synchronous momentum SGD (BSP, lr K·η on the mean gradient: the same steps per "
            "gradient) is the reference the ordering aims at."
        )
        return verdict, text + "\n\n" + "\n".join(f"- {line}" for line in lines)

    return Experiment(
        "ormo",
        "OrMo vs ASGD vs naive momentum ASGD vs synchronous momentum SGD",
        "Shi et al., 2024, Ordered Momentum for Asynchronous SGD (reconstructed rule)",
        "OrMo converges better than ASGD and naive momentum ASGD, homogeneous and heterogeneous.",
        f"digits MLP, K workers of equal speed (round-robin) or speeds 1:1:2:4, {steps} gradients; OrMo and "
        f"momentum ASGD at per-gradient lr {eta} with β 0.9, ASGD at {eta / (1 - 0.9):g} (the same effective "
        "step), sync momentum SGD at lr K·η; final test accuracy.",
        "workers K",
        points,
        judge,
    )


# -- time to target ------------------------------------------------------------------------------

TIME_TO_TARGET_RULES: dict[str, tuple[str, dict[str, str], str]] = {
    # label -> (rule, options, consistency); learning rates as in the cluster integration tests
    "ASGD": ("asgd", {"lr": "0.1"}, "async"),
    "momentum": ("momentum", {"lr": "0.03", "momentum": "0.7"}, "async"),
    "SA": ("sa", {"lr": "0.2"}, "async"),
    "DynSGD": ("dynsgd", {"lr": "0.05", "window": "4"}, "async"),
    "DOWNPOUR": ("downpour", {"lr": "0.05", "window": "4"}, "async"),
    "DC-ASGD": ("dc-asgd", {"lr": "0.1"}, "async"),
    "GA": ("gap-aware", {"lr": "0.2"}, "async"),
    "AB": ("adaptive-braking", {"lr": "0.02"}, "async"),
    "OrMo": ("ormo", {"lr": "0.02"}, "async"),
    "OrMo-DA": ("ormo-da", {"lr": "0.02"}, "async"),
    "EASGD": ("easgd", {"lr": "0.05", "window": "4"}, "async"),
    "EAMSGD": ("eamsgd", {"lr": "0.02", "window": "4"}, "async"),
    "AGN": ("agn", {"lr": "0.002", "window": "4"}, "async"),
    "GEM": ("gem", {"lr": "0.05"}, "async"),
    "SSP (ASGD, s=2)": ("asgd", {"lr": "0.1"}, "ssp"),
    "BSP (SGD)": ("asgd", {"lr": "0.1"}, "bsp"),
}
TARGET_ACCURACY = 0.9


def ttt_experiment(quick: bool) -> Experiment:
    steps, task = (300, "digits-mlp") if quick else (4000, "digits")
    labels = ["ASGD", "BSP (SGD)"] if quick else list(TIME_TO_TARGET_RULES)
    points = []
    for label in labels:
        rule, options, consistency = TIME_TO_TARGET_RULES[label]
        config = SimConfig(
            rule=rule,
            options=options,
            consistency=consistency,
            ssp_bound=2,
            workers=4,
            speeds=HETERO,
            task=task,
            steps=steps,
            eval_every=20,
            target_accuracy=TARGET_ACCURACY,
            stop_at_target=True,
        )
        points.append(Point(label, 4.0, config))

    def judge(agg: Aggregates) -> tuple[str, str]:
        bsp = _mean(agg, "BSP (SGD)", 4.0)
        faster = [s for s, _ in agg if s != "BSP (SGD)" and _mean(agg, s, 4.0) < bsp - _std(agg, s, 4.0)]
        lines = [f"{s}: {_fmt(agg, s, 4.0)} virtual s" for s, _ in sorted(agg, key=lambda k: _mean(agg, *k))]
        async_count = len(agg) - 1
        verdict = "reproduced" if len(faster) >= async_count * 0.75 else "partly" if faster else "not reproduced"
        text = (
            f"{len(faster)} of {async_count} rules reach {TARGET_ACCURACY:.0%} test accuracy sooner than BSP "
            f"({bsp:.1f} virtual s) beyond their seed spread. Runs that never reach the target count as the "
            "whole budget."
        )
        return verdict, text + "\n\n" + "\n".join(f"- {line}" for line in lines)

    return Experiment(
        "ttt",
        "Time to target accuracy on a 1:1:2:4 cluster, every rule vs BSP",
        "the premise of hetps (asynchronous, staleness-aware rules on heterogeneous workers)",
        "On workers of speeds 1:1:2:4, asynchronous rules reach a target accuracy in less wall-clock time than BSP, "
        "which waits for the slowest worker every step.",
        f"{'digits CNN' if task == 'digits' else 'digits MLP'}, 4 workers with step times 1, 1, 2, 4 virtual s, "
        f"evaluated every 20 gradients, stop at {TARGET_ACCURACY:.0%} test accuracy (budget {steps} gradients); "
        "learning rates as in the cluster integration tests. Virtual seconds to the target.",
        "",
        points,
        judge,
        metric="time_to_target_s",
    )


def experiments(quick: bool, only: set[str] | None = None) -> list[Experiment]:
    builders = [agn_experiment, ab_experiment, ga_experiment, gem_experiment, ormo_experiment, ttt_experiment]
    built = [b(quick) for b in builders]
    if quick:
        built = [e for e in built if e.key in {"ga", "ttt"}]
    return [e for e in built if only is None or e.key in only]
