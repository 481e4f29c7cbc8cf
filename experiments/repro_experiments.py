"""The digits reproductions: one experiment per paper claim, as simulator configurations and a verdict.

Each :class:`Experiment` lists its series (a rule with its options) over an x axis (workers,
delay, ...). Every point runs for several seeds; :mod:`experiments.reproduce` runs them,
aggregates mean ± std and asks the experiment's ``judge`` for a verdict in plain words.
Scales (steps per run, grids) are chosen so the full set fits an hour on two CPU cores;
``quick`` keeps a tiny subset for the smoke test. The Fashion-MNIST variants are in
:mod:`experiments.repro_fashion`, the learning-rate sweep at D = 32 in :mod:`experiments.repro_ab_sweep`.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

from experiments.repro_common import (
    CONSTANT,
    EXP,
    HETERO,
    Aggregates,
    Experiment,
    Point,
    Scale,
    Series,
    beats,
    fmt,
    grid,
    mean_of,
    relation,
    std_of,
)
from pstools.simulate import SimConfig

# -- AGN ----------------------------------------------------------------------------------


def agn_experiment(quick: bool, scale: Scale | None = None) -> Experiment:
    """``scale.lrs``: AGN's (local Adam) and the SGD rules' rates."""
    ns, windows, steps = ([5, 20], [1, 10], 300) if quick else ([5, 10, 20, 40], [1, 5, 10, 20], 3000)
    task, words, agn_lr, sgd_lr, batch = "digits-mlp", "digits MLP", "0.002", "0.05", 32
    if scale:
        ns, windows, steps, task, words, batch = (
            list(scale.xs),
            list(scale.windows),
            scale.steps,
            scale.task,
            scale.words,
            64,
        )
        agn_lr, sgd_lr = scale.lrs
    points = []
    for lam in windows:
        for n in ns:
            base = SimConfig(workers=n, speeds=EXP, task=task, steps=steps, eval_every=steps)
            for label, rule, lr in (("AGN", "agn", agn_lr), ("DynSGD", "dynsgd", sgd_lr), ("EASGD", "easgd", sgd_lr)):
                options = {"lr": lr, "window": str(lam)}
                points.append(Point(f"{label} λ={lam}", float(n), replace(base, rule=rule, options=options)))

    def judge(agg: Aggregates) -> tuple[str, str]:
        wins = losses = ties = 0
        lines = []
        for lam in windows:
            for n in ns:
                a, d, e = f"AGN λ={lam}", f"DynSGD λ={lam}", f"EASGD λ={lam}"
                against = [beats(agg, a, d, n), beats(agg, a, e, n)]
                wins += against.count(1)
                losses += against.count(-1)
                ties += against.count(0)
                lines.append(f"n={n}, λ={lam}: AGN {fmt(agg, a, n)}, DynSGD {fmt(agg, d, n)}, EASGD {fmt(agg, e, n)}")
        total = wins + losses + ties
        verdict = "reproduced" if wins >= 0.75 * total else "partly" if wins > losses else "not reproduced"
        text = (
            f"Over {total} comparisons (AGN against DynSGD and against EASGD at each n and λ), AGN is better "
            f"beyond the seed spread in {wins}, worse in {losses}, and within the spread in {ties}."
        )
        return verdict, text + "\n\n" + "\n".join(f"- {line}" for line in lines)

    return Experiment(
        "agn" + (scale.suffix if scale else ""),
        "AGN vs DynSGD vs asynchronous EASGD" + (scale.variant if scale else ""),
        "Hermans et al., 2017, Accumulated Gradient Normalization",
        "AGN converges better than asynchronous EASGD and DynSGD (MNIST MLP, n = 20–40 workers, λ = 20); "
        "it loses when λ ≪ n.",
        f"{words}, exponential step times (mean 1), a fixed budget of {steps} gradients (all workers "
        f"together, batch {batch}) split over n workers; AGN with local Adam (lr {agn_lr}), DynSGD and EASGD with "
        f"local SGD (lr {sgd_lr}, ρ = 5); final test accuracy.",
        "workers n",
        points,
        judge,
        task=scale.family if scale else "digits",
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
            f"D={int(d)}: " + ", ".join(f"{s.label} {fmt(agg, s.label, d)}" for s in series) for d in map(float, delays)
        ]
        ab_drop = mean_of(agg, "AB α=1", 0.0) - mean_of(agg, "AB α=1", float(big))
        mom_drop = mean_of(agg, "momentum ASGD", 0.0) - mean_of(agg, "momentum ASGD", float(big))
        better = beats(agg, "AB α=1", "momentum ASGD", float(big))
        flip_worse = beats(agg, "AB α=1", "AB sign-flipped", float(big)) == 1
        helped = [int(d) for d in delays if d and beats(agg, "AB α=1", "momentum ASGD", float(d)) == 1]
        verdict = "reproduced" if better == 1 and ab_drop < 0.02 else "partly" if helped else "not reproduced"
        text = (
            f"At D={big}, AB (α=1) loses {ab_drop * 100:.1f} points against its D=0 accuracy, momentum ASGD "
            f"loses {mom_drop * 100:.1f}; AB is {relation(better)} momentum ASGD there. AB (α=1) beats momentum "
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
        grid(series, delays, "delay"),
        judge,
        log_x=False,
    )


# -- Gap-Aware ------------------------------------------------------------------------------------


def ga_experiment(quick: bool, scale: Scale | None = None) -> Experiment:
    """``scale.lrs``: the SGD rules' rate and the momentum rules' rate."""
    ns, steps = ([4, 16], 200) if quick else ([4, 8, 16, 32, 64], 2000)
    task, words, sgd_lr, mom_lr = "digits-mlp", "digits MLP", "0.2", "0.02"
    if scale:
        ns, steps, task, words, (sgd_lr, mom_lr) = list(scale.xs), scale.steps, scale.task, scale.words, scale.lrs
    base = SimConfig(task=task, steps=steps, eval_every=steps, speeds=EXP)
    series = [
        Series("ASGD", replace(base, rule="asgd", options={"lr": sgd_lr})),
        Series("SA", replace(base, rule="sa", options={"lr": sgd_lr})),
        Series("GA", replace(base, rule="gap-aware", options={"lr": sgd_lr})),
        Series("momentum ASGD", replace(base, rule="momentum", options={"lr": mom_lr, "momentum": "0.9"})),
        Series("GA + momentum", replace(base, rule="gap-aware", options={"lr": mom_lr, "momentum": "0.9"})),
    ]
    if quick:
        series = series[1:3]
    elif scale and scale.series:
        series = [s for s in series if s.label in scale.series]

    def judge(agg: Aggregates) -> tuple[str, str]:
        lines = [
            f"n={int(n)}: " + ", ".join(f"{s.label} {fmt(agg, s.label, n)}" for s in series) for n in map(float, ns)
        ]
        vs_sa = [beats(agg, "GA", "SA", float(n)) for n in ns]
        gaps = [mean_of(agg, "GA", float(n)) - mean_of(agg, "SA", float(n)) for n in ns]
        growing = gaps[-1] > gaps[0]
        text = (
            f"GA vs SA (GA − SA): {', '.join(f'n={n}: {g * 100:+.1f} pts' for n, g in zip(ns, gaps, strict=True))}; "
            f"GA is better beyond the spread at {vs_sa.count(1)} of {len(ns)} sizes, worse at {vs_sa.count(-1)}."
        )
        momentum_ok = True
        if "GA + momentum" in {s.label for s in series}:
            big = float(ns[-1])
            helps = beats(agg, "GA + momentum", "GA", big)
            momentum_ok = helps >= 0
            text += (
                f" At n={ns[-1]}, GA with momentum is {relation(helps)} "
                f"GA without ({fmt(agg, 'GA + momentum', big)} vs {fmt(agg, 'GA', big)}), and against naive momentum "
                f"ASGD {fmt(agg, 'momentum ASGD', big)}."
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
        "ga" + (scale.suffix if scale else ""),
        "Gap-Aware vs staleness-aware (SA) vs ASGD, with and without momentum" + (scale.variant if scale else ""),
        "Barkai, Hakimi & Schuster, ICLR 2020, Gap-Aware Mitigation of Gradient Staleness (reconstructed rule)",
        "GA beats SA in final accuracy, more so as workers grow; with GA, momentum helps even with many workers.",
        f"{words}, exponential step times (mean 1, so τ ≈ n − 1), {steps} gradients; SGD rules at lr {sgd_lr}, "
        f"momentum rules at lr {mom_lr} with μ 0.9; final test accuracy.",
        "workers n",
        grid(series, ns, "workers"),
        judge,
        extra_plot="scale",
        task=scale.family if scale else "digits",
    )


# -- GEM ----------------------------------------------------------------------------------------


def gem_experiment(quick: bool, scale: Scale | None = None) -> Experiment:
    """``scale.lrs``: the rates every rule runs at (the claim's failure of DOWNPOUR is at the last)."""
    ns, steps, lrs, task = (
        ([5, 20], 200, ["0.05"], "digits-mlp") if quick else ([5, 10, 20, 50, 100], 2000, ["0.05", "0.1"], "digits")
    )
    words = "digits CNN" if task == "digits" else "digits MLP"
    if scale:
        ns, steps, lrs, task, words = list(scale.xs), scale.steps, list(scale.lrs), scale.task, scale.words
    series = []
    for lr in lrs:
        base = SimConfig(task=task, steps=steps, eval_every=steps, speeds=EXP)
        series += [
            Series(f"GEM η={lr}", replace(base, rule="gem", options={"lr": lr, "momentum": "0.9"})),
            Series(f"DOWNPOUR η={lr}", replace(base, rule="downpour", options={"lr": lr, "window": "1"})),
            Series(f"1/(τ+1) η={lr}", replace(base, rule="dynsgd", options={"lr": lr, "window": "1"})),
        ]
    if scale and scale.series:
        series = [s for s in series if s.label.split(" η=")[0] in scale.series]

    def judge(agg: Aggregates) -> tuple[str, str]:
        lines = [
            f"n={int(n)}: " + ", ".join(f"{s.label} {fmt(agg, s.label, n)}" for s in series) for n in map(float, ns)
        ]
        big = float(ns[-1])
        gem = f"GEM η={lrs[0]}"
        drop_gem = mean_of(agg, gem, float(ns[0])) - mean_of(agg, gem, big)
        drop_dp = mean_of(agg, f"DOWNPOUR η={lrs[0]}", float(ns[0])) - mean_of(agg, f"DOWNPOUR η={lrs[0]}", big)
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
            g, d = mean_of(agg, f"GEM η={hi}", big), mean_of(agg, f"DOWNPOUR η={hi}", big)
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
        "gem" + (scale.suffix if scale else ""),
        "GEM vs DOWNPOUR vs 1/(τ+1) as workers grow" + (scale.variant if scale else ""),
        "Hermans & Louppe, 2018, Gradient Energy Matching",
        "GEM stays stable where DOWNPOUR degrades as workers are added (up to 100 workers); the median π "
        "falls as workers are added; at η = 0.1 DOWNPOUR fails and GEM converges.",
        f"{words}, exponential step times, {steps} gradients; "
        "GEM with μ 0.9, κ 1 (atomic pull-and-commit); DOWNPOUR and the 1/(τ+1) rule (DynSGD) push every "
        f"step; η in {{{', '.join(lrs)}}}; final test accuracy.",
        "workers n",
        grid(series, ns, "workers"),
        judge,
        extra_plot="pi_median",
        task=scale.family if scale else "digits",
    )


# -- OrMo -----------------------------------------------------------------------------------------


def _ormo_rows(base: SimConfig, eta: float, beta: str) -> list[tuple[str, SimConfig]]:
    """OrMo and what it is compared with, on ``base``'s cluster, at the same steps per gradient."""
    return [
        ("OrMo", replace(base, rule="ormo", options={"lr": str(eta), "beta": beta})),
        ("ASGD", replace(base, rule="asgd", options={"lr": str(eta / (1 - 0.9))})),
        ("momentum ASGD", replace(base, rule="momentum", options={"lr": str(eta), "momentum": beta})),
        (
            "sync momentum SGD",
            replace(
                base, rule="momentum", consistency="bsp", options={"lr": f"{eta * base.workers:g}", "momentum": beta}
            ),
        ),
    ]


def _ormo_score(agg: Aggregates, mixes: list[str], ks: list[int]) -> dict[str, int]:
    """How often OrMo beats ASGD and momentum ASGD beyond the seed spread, loses, or ties."""
    score = {"win": 0, "loss": 0, "tie": 0}
    for tag in mixes:
        for k in ks:
            for other in ("ASGD", "momentum ASGD"):
                if (f"{other} ({tag})", float(k)) not in agg:
                    continue
                b = beats(agg, f"OrMo ({tag})", f"{other} ({tag})", float(k))
                score["win" if b == 1 else "loss" if b == -1 else "tie"] += 1
    return score


def ormo_experiment(quick: bool, scale: Scale | None = None) -> Experiment:
    """``scale.lrs``: the per-gradient rate η; ``scale.series``: the speed mixes ("homogeneous", "1:1:2:4")."""
    ks, steps = ([4], 200) if quick else ([4, 16, 64], 2000)
    task, words, mixes = "digits-mlp", "digits MLP", ["homogeneous", "1:1:2:4"]
    eta, beta = 0.01, "0.9"
    if scale:
        ks, steps, task, words, eta = list(scale.xs), scale.steps, scale.task, scale.words, float(scale.lrs[0])
        mixes = list(scale.series or mixes)
    points = []
    for speeds, tag in ((CONSTANT, "homogeneous"), (HETERO, "1:1:2:4")):
        if tag not in mixes:
            continue
        for k in ks:
            base = SimConfig(task=task, steps=steps, eval_every=steps, speeds=speeds, workers=k)
            rows = _ormo_rows(base, eta, beta)
            if quick:
                rows = rows[:1] + rows[2:3]
            points += [Point(f"{label} ({tag})", float(k), config) for label, config in rows]

    def judge(agg: Aggregates) -> tuple[str, str]:
        labels = sorted({s for s, _ in agg})
        lines = [f"K={int(k)}: " + ", ".join(f"{s} {fmt(agg, s, float(k))}" for s in labels) for k in ks]
        score = _ormo_score(agg, mixes, ks)
        total = sum(score.values())
        verdict = (
            "reproduced"
            if score["win"] >= 0.75 * total
            else "partly"
            if score["win"] > score["loss"]
            else "not reproduced"
        )
        text = (
            f"OrMo against ASGD and naive momentum ASGD, at every K and {' and '.join(mixes)} speeds "
            f"({total} comparisons): "
            f"better beyond the seed spread in {score['win']}, worse in {score['loss']}, within the spread in "
            f"{score['tie']}. Synchronous momentum SGD (BSP, lr K·η on the mean gradient: the same steps per "
            "gradient) is the reference the ordering aims at."
        )
        return verdict, text + "\n\n" + "\n".join(f"- {line}" for line in lines)

    return Experiment(
        "ormo" + (scale.suffix if scale else ""),
        "OrMo vs ASGD vs naive momentum ASGD vs synchronous momentum SGD" + (scale.variant if scale else ""),
        "Shi et al., 2024, Ordered Momentum for Asynchronous SGD (reconstructed rule)",
        "OrMo converges better than ASGD and naive momentum ASGD, homogeneous and heterogeneous.",
        f"{words}, K workers of {' or '.join(mixes)} speeds"
        f"{' (equal speeds run round-robin)' if 'homogeneous' in mixes else ''}, {steps} gradients; OrMo and "
        f"momentum ASGD at per-gradient lr {eta} with β 0.9, ASGD at {eta / (1 - 0.9):g} (the same effective "
        "step), sync momentum SGD at lr K·η; final test accuracy.",
        "workers K",
        points,
        judge,
        task=scale.family if scale else "digits",
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


def ttt_experiment(
    quick: bool,
    scale: Scale | None = None,
    rules: dict[str, tuple[str, dict[str, str], str]] | None = None,
    target: float = TARGET_ACCURACY,
    eval_every: int = 20,
) -> Experiment:
    """``rules``: label -> (rule, options, consistency), "BSP (SGD)" among them (default the digits set)."""
    steps, task = (300, "digits-mlp") if quick else (4000, "digits")
    words = "digits CNN" if task == "digits" else "digits MLP"
    rates = "learning rates as in the cluster integration tests"
    rules = rules or TIME_TO_TARGET_RULES
    labels = ["ASGD", "BSP (SGD)"] if quick else list(rules)
    if scale:
        steps, task, words = scale.steps, scale.task, scale.words
        rates = "learning rates: " + ", ".join(f"{label} {rules[label][1]['lr']}" for label in labels)
    points = []
    for label in labels:
        rule, options, consistency = rules[label]
        config = SimConfig(
            rule=rule,
            options=options,
            consistency=consistency,
            ssp_bound=2,
            workers=4,
            speeds=HETERO,
            task=task,
            steps=steps,
            eval_every=eval_every,
            target=target,
            stop_at_target=True,
        )
        points.append(Point(label, 4.0, config))

    def judge(agg: Aggregates) -> tuple[str, str]:
        bsp = mean_of(agg, "BSP (SGD)", 4.0)
        faster = [s for s, _ in agg if s != "BSP (SGD)" and mean_of(agg, s, 4.0) < bsp - std_of(agg, s, 4.0)]
        lines = [f"{s}: {fmt(agg, s, 4.0)} virtual s" for s, _ in sorted(agg, key=lambda k: mean_of(agg, *k))]
        async_count = len(agg) - 1
        verdict = "reproduced" if len(faster) >= async_count * 0.75 else "partly" if faster else "not reproduced"
        text = (
            f"{len(faster)} of {async_count} rules reach {target:.0%} test accuracy sooner than BSP "
            f"({bsp:.1f} virtual s) beyond their seed spread. Runs that never reach the target count as the "
            "whole budget."
        )
        return verdict, text + "\n\n" + "\n".join(f"- {line}" for line in lines)

    return Experiment(
        "ttt" + (scale.suffix if scale else ""),
        "Time to target accuracy on a 1:1:2:4 cluster, every rule vs BSP" + (scale.variant if scale else ""),
        "the premise of hetps (asynchronous, staleness-aware rules on heterogeneous workers)",
        "On workers of speeds 1:1:2:4, asynchronous rules reach a target accuracy in less wall-clock time than BSP, "
        "which waits for the slowest worker every step.",
        f"{words}, 4 workers with step times 1, 1, 2, 4 virtual s, "
        f"evaluated every {eval_every} gradients, stop at {target:.0%} test accuracy (budget {steps} gradients); "
        f"{rates}. Virtual seconds to the target.",
        "",
        points,
        judge,
        metric="time_to_target_s",
        task=scale.family if scale else "digits",
    )
