"""Reproduce every paper's claim in the simulator; write JSON, PNG plots and a markdown report.

    python -m benchmarks.reproduce [--quick] [--out DIR] [--doc docs/reproduction.md] [--jobs 2]
    python -m benchmarks.reproduce --real-cluster [--updates 400]   # the gRPC check, appended to the JSON

Every run goes through the real shard and worker procedures (``psworker.simulate``), several
seeds per point; the report gives each claim, our numbers as mean ± std and a verdict.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from benchmarks.repro_experiments import TIME_TO_TARGET_RULES, Aggregates, Experiment, Point, experiments
from psworker.simulate import SimConfig, SpeedModel, simulate

SEEDS = (0, 1, 2)


def _init_worker() -> None:
    import torch

    torch.set_num_threads(1)


def run_point(job: tuple[str, int, Point, int]) -> tuple[str, int, int, dict[str, Any]]:
    key, index, point, seed = job
    result = simulate(replace(point.config, seed=seed, record_pushes=False))
    metric = result.time_to_target_s
    if metric is None:
        metric = result.virtual_s  # never reached: the whole budget
    return (
        key,
        index,
        seed,
        {
            "test_accuracy": result.test_accuracy,
            "test_loss": result.test_loss if math.isfinite(result.test_loss) else None,
            "time_to_target_s": metric,
            "reached_target": result.time_to_target_s is not None,
            "diverged": result.diverged,
            "mean_staleness": result.mean_staleness,
            "telemetry": result.telemetry,
            "virtual_s": result.virtual_s,
            "clock": result.clock,
            "steps": result.steps,
            "wall_s": result.wall_s,
            "curve": [[p.virtual_s, p.steps, p.test_accuracy] for p in result.curve],
        },
    )


def aggregate(exp: Experiment, runs: dict[int, dict[int, dict[str, Any]]]) -> Aggregates:
    agg: Aggregates = {}
    for index, point in enumerate(exp.points):
        by_seed = runs[index]
        values = [float(by_seed[s][exp.metric]) for s in sorted(by_seed)]
        telemetry: dict[str, float] = {}
        for key in {k for r in by_seed.values() for k in r["telemetry"]}:
            telemetry[key] = statistics.fmean(r["telemetry"][key] for r in by_seed.values() if key in r["telemetry"])
        agg[(point.series, point.x)] = {
            "mean": statistics.fmean(values),
            "std": statistics.pstdev(values) if len(values) > 1 else 0.0,
            "values": values,
            "diverged": sum(bool(r["diverged"]) for r in by_seed.values()),
            "mean_staleness": statistics.fmean(float(r["mean_staleness"]) for r in by_seed.values()),
            "telemetry": telemetry,
            "wall_s": sum(float(r["wall_s"]) for r in by_seed.values()),
        }
    return agg


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


def plot(exp: Experiment, agg: Aggregates, runs: dict[int, dict[int, dict[str, Any]]], path: Path) -> None:
    series = list(dict.fromkeys(p.series for p in exp.points))
    panels = 2 if exp.extra_plot or exp.metric == "time_to_target_s" else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.6), squeeze=False)
    ax = axes[0][0]
    if exp.metric == "time_to_target_s":
        order = sorted(series, key=lambda s: _float(agg[(s, 4.0)]["mean"]))
        means = [_float(agg[(s, 4.0)]["mean"]) for s in order]
        stds = [_float(agg[(s, 4.0)]["std"]) for s in order]
        colors = ["tab:red" if s.startswith("BSP") else "tab:blue" for s in order]
        ax.barh(order, means, xerr=stds, color=colors)
        ax.invert_yaxis()
        ax.set_xlabel("virtual seconds to the target accuracy (mean ± std over seeds)")
        curves = axes[0][1]
        for index, point in enumerate(exp.points):
            curve = runs[index][min(runs[index])]["curve"]
            style = "--" if point.series.startswith(("BSP", "SSP")) else "-"
            curves.plot([c[0] for c in curve], [c[2] for c in curve], style, label=point.series, linewidth=1)
        curves.set_xlabel("virtual seconds")
        curves.set_ylabel("test accuracy (seed 0)")
        curves.set_ylim(0, 1)
        curves.legend(fontsize=6, ncol=2)
        curves.grid(alpha=0.3)
    else:
        styles = series_styles(series)
        for label in series:
            xs = sorted(x for s, x in agg if s == label)
            means = [_float(agg[(label, x)]["mean"]) for x in xs]
            stds = [_float(agg[(label, x)]["std"]) for x in xs]
            ax.errorbar(xs, means, yerr=stds, capsize=3, label=label, linewidth=1.2, markersize=4, **styles[label])
        ax.set_xlabel(exp.xlabel)
        ax.set_ylabel("final test accuracy (mean ± std over seeds)")
        if exp.log_x:
            ax.set_xscale("log", base=2)
        ax.legend(fontsize=7, ncol=2 if len(series) > 6 else 1)
        if exp.extra_plot:
            extra = axes[0][1]
            for label in series:
                xs = sorted(x for s, x in agg if s == label)
                tele = [agg[(label, x)]["telemetry"] for x in xs]
                ys = [t.get(exp.extra_plot, math.nan) if isinstance(t, dict) else math.nan for t in tele]
                if not all(math.isnan(y) for y in ys):
                    extra.plot(xs, ys, marker="o", label=label)
            extra.set_xlabel(exp.xlabel)
            extra.set_ylabel(f"mean of telemetry '{exp.extra_plot}'")
            if exp.log_x:
                extra.set_xscale("log", base=2)
            extra.legend(fontsize=7)
            extra.grid(alpha=0.3)
    ax.grid(alpha=0.3)
    fig.suptitle(exp.title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _float(value: object) -> float:
    assert isinstance(value, float)
    return value


def run_all(
    exps: Sequence[Experiment], jobs: int, seeds: Sequence[int]
) -> dict[str, dict[int, dict[int, dict[str, Any]]]]:
    work = [(e.key, i, p, s) for e in exps for i, p in enumerate(e.points) for s in seeds]
    # Long runs first, so the pool does not end on one straggler.
    work.sort(key=lambda job: -(job[2].config.steps * (3 if job[2].config.task == "digits" else 1)))
    results: dict[str, dict[int, dict[int, dict[str, Any]]]] = {e.key: {} for e in exps}
    done = 0
    started = time.perf_counter()
    if jobs > 1:
        with multiprocessing.get_context("spawn").Pool(jobs, initializer=_init_worker) as pool:
            for key, index, seed, summary in pool.imap_unordered(run_point, work):
                results[key].setdefault(index, {})[seed] = summary
                done += 1
                if done % 20 == 0:
                    print(f"  {done}/{len(work)} runs, {time.perf_counter() - started:.0f} s", flush=True)
    else:
        _init_worker()
        for job in work:
            key, index, seed, summary = run_point(job)
            results[key].setdefault(index, {})[seed] = summary
    return results


def report(
    exps: Sequence[Experiment],
    results: dict[str, dict[int, dict[int, dict[str, Any]]]],
    out: Path,
    img_dir: Path,
    doc: Path,
    quick: bool,
    seeds: Sequence[int],
    elapsed_s: float,
    real_cluster: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    img_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"quick": quick, "seeds": list(seeds), "elapsed_s": elapsed_s, "experiments": {}}
    sections = []
    verdicts = []
    for exp in exps:
        agg = aggregate(exp, results[exp.key])
        verdict, text = exp.judge(agg)
        image = img_dir / f"repro_{exp.key}.png"
        plot(exp, agg, results[exp.key], image)
        summary["experiments"][exp.key] = {
            "title": exp.title,
            "claim": exp.claim,
            "verdict": verdict,
            "text": text,
            "points": [{"series": s, "x": x, **a} for (s, x), a in sorted(agg.items())],
            "runs": {str(i): {str(s): r for s, r in by.items()} for i, by in results[exp.key].items()},
        }
        verdicts.append((exp.title, verdict))
        try:
            rel = image.relative_to(doc.parent)
        except ValueError:
            rel = image
        wall = sum(_float(a["wall_s"]) for a in agg.values())
        sections.append(
            f"## {exp.title}\n\n**Paper.** {exp.paper}.\n\n**Claim.** {exp.claim}\n\n**Set-up.** {exp.setup} "
            f"{len(seeds)} seed(s) per point; {len(exp.points) * len(seeds)} runs, {wall:.0f} s of compute.\n\n"
            f"**Verdict: {verdict}.** {text}\n\n![{exp.title}]({rel.as_posix()})\n"
        )
    if real_cluster:
        sections.append(_real_cluster_section(real_cluster))
    table = "\n".join(f"| {title} | {verdict} |" for title, verdict in verdicts)
    mode = "quick (a smoke-test subset, too small to judge the claims)" if quick else "full"
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(
        "# Reproductions\n\n"
        "Generated by `python -m benchmarks.reproduce` "
        f"({mode} mode, {elapsed_s / 60:.1f} minutes). Every run is `psworker simulate`: a virtual cluster in one "
        "process where every update goes through the server's own shard and rules and every worker runs its real "
        "worker procedure, in virtual time (a 1× worker's step takes 1 virtual second). Tasks run on CPU: the "
        "digits CNN (`digits`, 8×8 images, ~40k parameters) and an MLP on the same 64 pixels (`digits-mlp`). "
        "Numbers are final test accuracy on the 360 held-out digits (or virtual seconds), mean ± std over "
        "seeds (the seed drives batch sampling and step times; the data split and the initial model are fixed). "
        "A difference counts only when it is larger than the two spreads added. AB, GA and OrMo are "
        "reconstructed from the papers' abstracts and related code (see docs/rules.md), so their verdicts test "
        "our reconstruction as much as the papers.\n\n"
        "These are small models on a small data set, a long way from the papers' MNIST/CIFAR/ImageNet runs: a claim "
        "that does not reproduce here may still hold at the papers' scale, and one that does is only evidence.\n\n"
        "| claim | verdict |\n|---|---|\n" + table + "\n\n" + "\n".join(sections)
    )
    (out / "reproduction.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


# -- the real-cluster check --------------------------------------------------------------------


def real_cluster_check(
    updates: int, seeds: Sequence[int], out: Path, rules: Sequence[str] | None
) -> list[dict[str, Any]]:
    """One configuration per rule over real gRPC (``run_cluster``) against the simulator's seed spread."""
    from psworker.launcher import ClusterConfig, run_cluster

    rows = []
    for label, (rule, options, consistency) in TIME_TO_TARGET_RULES.items():
        if rules is not None and label not in rules:
            continue
        config = SimConfig(
            rule=rule,
            options=options,
            consistency=consistency,
            ssp_bound=2,
            workers=4,
            speeds=SpeedModel.parse("1:1:2:4"),
            task="digits",
            steps=10**9,
            max_updates=updates,
            eval_every=10**9,
            record_pushes=False,
        )
        sim = [simulate(replace(config, seed=s)).test_accuracy for s in seeds]
        lr = float(options["lr"])
        opts = tuple(f"{k}={v}" for k, v in options.items() if k != "lr")
        server_args = ("--consistency", consistency, "--ssp-bound", "2")
        started = time.perf_counter()
        report = run_cluster(
            ClusterConfig(
                rule=rule,
                lr=lr,
                rule_opts=opts,
                until_clock=updates,
                log_dir=out / "cluster" / label.replace(" ", "_").replace("/", "_"),
                server_args=server_args,
            )
        )
        mean, std = statistics.fmean(sim), statistics.pstdev(sim)
        inside = min(sim) - std <= report.test_accuracy <= max(sim) + std
        rows.append(
            {
                "rule": label,
                "cluster_accuracy": report.test_accuracy,
                "cluster_clock": report.clock,
                "cluster_wall_s": time.perf_counter() - started,
                "sim_mean": mean,
                "sim_std": std,
                "sim_values": sim,
                "within_spread": inside,
            }
        )
        print(f"  {label}: cluster {report.test_accuracy:.3f}, simulator {mean:.3f} ± {std:.3f}", flush=True)
    return rows


def _real_cluster_section(rows: list[dict[str, Any]]) -> str:
    inside = sum(bool(r["within_spread"]) for r in rows)
    lines = [
        f"| {r['rule']} | {r['cluster_accuracy']:.3f} ({r['cluster_clock']} updates) | {r['sim_mean']:.3f} ± "
        f"{r['sim_std']:.3f} ({', '.join(f'{v:.3f}' for v in r['sim_values'])}) | "
        f"{'yes' if r['within_spread'] else 'no'} |"
        for r in rows
    ]
    return (
        "## Real-cluster check\n\n"
        "The same configuration over real gRPC with `psworker cluster` (4 worker processes slowed 1×, 1×, 2×, 4×, "
        "one server, digits CNN, the time-to-target learning rates) and in the simulator with the same number of "
        "updates. 'Within' means the cluster's accuracy lies inside the simulator's seed range widened by one std. "
        f"{inside} of {len(rows)} rules land within it.\n\n"
        "| rule | real cluster | simulator, mean ± std (seeds) | within |\n|---|---|---|---|\n"
        + "\n".join(lines)
        + "\n"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tiny subset (the smoke test)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--doc", type=Path, default=None, help="markdown report (default OUT/reproduction.md)")
    parser.add_argument("--img-dir", type=Path, default=None, help="plots (default OUT)")
    parser.add_argument("--jobs", type=int, default=2, help="processes")
    parser.add_argument("--seeds", type=int, default=len(SEEDS))
    parser.add_argument("--only", default=None, help="comma-separated experiment keys: agn,ab,ga,gem,ormo,ttt")
    parser.add_argument("--real-cluster", action="store_true", help="also run the gRPC check")
    parser.add_argument("--real-cluster-rules", default=None, help="comma-separated labels (default all)")
    parser.add_argument("--updates", type=int, default=400, help="updates per real-cluster run")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    doc = args.doc or args.out / "reproduction.md"
    img_dir = args.img_dir or args.out
    seeds = list(range(args.seeds))
    only = set(args.only.split(",")) if args.only else None
    exps = experiments(args.quick, only)
    started = time.perf_counter()
    print(f"{sum(len(e.points) for e in exps) * len(seeds)} runs in {len(exps)} experiments", flush=True)
    results = run_all(exps, args.jobs, seeds)
    real = None
    if args.real_cluster:
        rules = args.real_cluster_rules.split(",") if args.real_cluster_rules else None
        real = real_cluster_check(args.updates, seeds, args.out, rules)
        (args.out / "real_cluster.json").write_text(json.dumps(real, indent=1))
    elapsed = time.perf_counter() - started
    summary = report(exps, results, args.out, img_dir, doc, args.quick, seeds, elapsed, real)
    for key, data in summary["experiments"].items():
        print(f"{key}: {data['verdict']}")
    print(f"done in {elapsed:.0f} s; report {doc}")


if __name__ == "__main__":
    main()
