"""Reproduce every paper's claim in the simulator; write JSON, PNG plots and a markdown report.

    python -m benchmarks.reproduce [--quick] [--out DIR] [--doc docs/reproduction.md] [--jobs 2]
    python -m benchmarks.reproduce --only none --real-cluster [--updates 300] [--check-seeds 8]
        # only the gRPC check: each rule on a real local cluster, then the simulator replaying it
        # with the step times that cluster measured (written to OUT/real_cluster.json)

Every run goes through the real shard and worker procedures (``psworker.simulate``), several
seeds per point; the report gives each claim, our numbers as mean ± std and a verdict.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import re
import shlex
import statistics
import sys
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
    if not work:
        return {}
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
    real_cluster_command: str | None = None,
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
        sections.append(_real_cluster_section(real_cluster, real_cluster_command))
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
        "seeds (the seed drives batch sampling, and step times under random speed models; the data split and "
        "the initial model are fixed). "
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

CHECK_SEEDS = 8
CHECK_SLOWDOWNS = (1.0, 1.0, 2.0, 4.0)


def within_spread(value: float, values: Sequence[float]) -> bool:
    """Whether ``value`` lies in the range of ``values`` widened by their (population) std on each side."""
    if not values:
        return False
    std = statistics.pstdev(values) if len(values) > 1 else 0.0
    return min(values) - std <= value <= max(values) + std


def relative_speeds(profile: Sequence[Sequence[float]]) -> list[float]:
    """Each worker's mean measured step time over the fastest worker's (1.0 = the fastest)."""
    means = [statistics.fmean(times) for times in profile]
    fastest = min(means)
    return [m / fastest for m in means]


def join_clocks(log_dir: Path) -> list[int]:
    """The server's clock when each worker of a cluster run started (its log's ``start`` event), by rank.

    Worker processes start one after another, so the first to connect updates the model alone
    for a while; the simulator starts every worker at clock 0."""
    clocks = []
    for path in sorted(log_dir.glob("worker-*.jsonl"), key=lambda p: int(p.stem.rpartition("-")[2])):
        starts = [json.loads(line) for line in path.read_text().splitlines() if '"event": "start"' in line]
        clocks.append(int(starts[0]["clock"]) if starts else -1)
    return clocks


def _check_config(rule: str, options: dict[str, str], consistency: str, speeds: SpeedModel, updates: int) -> SimConfig:
    return SimConfig(
        rule=rule,
        options=options,
        consistency=consistency,
        ssp_bound=2,
        workers=len(CHECK_SLOWDOWNS),
        speeds=speeds,
        task="digits",
        steps=10**9,
        max_updates=updates,
        eval_every=10**9,
        record_pushes=False,
    )


def _run_check_sim(job: tuple[str, str, int, SimConfig]) -> tuple[str, str, int, dict[str, Any]]:
    label, kind, seed, config = job
    result = simulate(replace(config, seed=seed))
    return (
        label,
        kind,
        seed,
        {
            "test_accuracy": result.test_accuracy,
            "clock": result.clock,
            "diverged": result.diverged,
            "staleness": [[w.mean_staleness, w.max_staleness] for w in result.workers],
            "steps": [w.steps for w in result.workers],
            "wall_s": result.wall_s,
        },
    )


def _sim_summary(runs: dict[int, dict[str, Any]]) -> dict[str, Any]:
    values = [float(runs[s]["test_accuracy"]) for s in sorted(runs)]
    workers = len(next(iter(runs.values()))["staleness"])
    return {
        "values": values,
        "mean": statistics.fmean(values),
        "std": statistics.pstdev(values) if len(values) > 1 else 0.0,
        # per worker: mean staleness averaged over seeds, and the largest staleness of any seed
        "staleness": [
            [
                statistics.fmean(float(r["staleness"][w][0]) for r in runs.values()),
                max(int(r["staleness"][w][1]) for r in runs.values()),
            ]
            for w in range(workers)
        ],
        "steps": [statistics.fmean(float(r["steps"][w]) for r in runs.values()) for w in range(workers)],
    }


def _replay_fields(prefix: str, runs: dict[int, dict[str, Any]], cluster_accuracy: float) -> dict[str, Any]:
    """A replay's summary as ``{prefix}_mean``, ``_std``, ``_values``, ``_staleness``, ``_steps`` and
    ``_within`` (the cluster's accuracy inside its spread)."""
    summary = _sim_summary(runs)
    fields = {f"{prefix}_{key}": value for key, value in summary.items()}
    fields[f"{prefix}_within"] = within_spread(cluster_accuracy, summary["values"])
    return fields


def real_cluster_check(
    updates: int,
    check_seeds: Sequence[int],
    ideal_seeds: Sequence[int],
    out: Path,
    rules: Sequence[str] | None,
    jobs: int = 1,
) -> list[dict[str, Any]]:
    """One configuration per rule over real gRPC (``run_cluster``) against the simulator's seed spread.

    Every cluster runs first, one at a time and with nothing else of ours running; then the
    simulator replays each with the step times that very cluster run measured
    (``profile:LOG_DIR``, ``check_seeds`` seeds, up to the cluster's final clock), which is
    what the verdict uses, and with exact 1:1:2:4 speeds (``ideal_seeds`` seeds) for comparison.
    """
    from psworker.launcher import ClusterConfig, ClusterError, run_cluster

    labels = [label for label in TIME_TO_TARGET_RULES if rules is None or label in rules]
    unknown = sorted(set(rules or ()) - set(TIME_TO_TARGET_RULES))
    if unknown:
        raise SystemExit(f"unknown real-cluster rule(s) {unknown}; choose from {list(TIME_TO_TARGET_RULES)}")
    rows: dict[str, dict[str, Any]] = {}
    work: list[tuple[str, str, int, SimConfig]] = []
    for label in labels:
        rule, options, consistency = TIME_TO_TARGET_RULES[label]
        log_dir = out / "cluster" / re.sub(r"[^\w.-]+", "_", label).strip("_")
        opts = tuple(f"{k}={v}" for k, v in options.items() if k != "lr")
        started = time.perf_counter()
        try:
            report = run_cluster(
                ClusterConfig(
                    workers=len(CHECK_SLOWDOWNS),
                    slowdowns=CHECK_SLOWDOWNS,
                    rule=rule,
                    lr=float(options["lr"]),
                    rule_opts=opts,
                    until_clock=updates,
                    log_dir=log_dir,
                    server_args=("--consistency", consistency, "--ssp-bound", "2"),
                )
            )
        except ClusterError as error:
            print(f"  {label}: the cluster failed: {error}", flush=True)
            rows[label] = {"rule": label, "error": str(error)}
            continue
        measured = SpeedModel.parse(f"profile:{log_dir}")
        rows[label] = {
            "rule": label,
            "log_dir": str(log_dir),
            "cluster_accuracy": report.test_accuracy,
            "cluster_clock": report.clock,
            "cluster_wall_s": time.perf_counter() - started,
            "cluster_staleness": [[w.mean_staleness, w.max_staleness] for w in report.workers],
            "cluster_steps": [w.steps for w in report.workers],
            "measured_speeds": relative_speeds(measured.profile),
            "join_clocks": join_clocks(log_dir),
        }
        speeds = ", ".join(f"{s:.1f}" for s in rows[label]["measured_speeds"])
        print(f"  {label}: cluster {report.test_accuracy:.3f} at clock {report.clock}, speeds {speeds}", flush=True)
        replay = _check_config(rule, options, consistency, measured, report.clock)
        exact_speeds = _check_config(rule, options, consistency, SpeedModel.parse("1:1:2:4"), report.clock)
        work += [(label, "profile", s, replay) for s in check_seeds]
        work += [(label, "ideal", s, exact_speeds) for s in ideal_seeds]
    # Window-4 procedures take four steps per update: start them first.
    work.sort(key=lambda job: -int(job[3].options.get("window", "1")))
    runs: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    print(f"  {len(work)} simulator runs", flush=True)
    if jobs > 1 and len(work) > 1:
        with multiprocessing.get_context("spawn").Pool(jobs, initializer=_init_worker) as pool:
            for label, kind, seed, summary in pool.imap_unordered(_run_check_sim, work):
                runs.setdefault((label, kind), {})[seed] = summary
    else:
        _init_worker()
        for job in work:
            label, kind, seed, summary = _run_check_sim(job)
            runs.setdefault((label, kind), {})[seed] = summary
    for label, row in rows.items():
        if "error" in row:
            continue
        row.update(_replay_fields("sim", runs[(label, "profile")], row["cluster_accuracy"]))
        if (label, "ideal") in runs:
            row.update(_replay_fields("ideal", runs[(label, "ideal")], row["cluster_accuracy"]))
        print(
            f"  {label}: cluster {row['cluster_accuracy']:.3f}, simulator (measured speeds) "
            f"{row['sim_mean']:.3f} ± {row['sim_std']:.3f}, within: {row['sim_within']}",
            flush=True,
        )
    return list(rows.values())


def _staleness(pairs: Sequence[Sequence[float]]) -> str:
    return " / ".join(f"{mean:.1f}" for mean, _ in pairs)


def _real_cluster_section(rows: list[dict[str, Any]], command: str | None = None) -> str:
    done = [r for r in rows if "error" not in r]
    failed = [r["rule"] for r in rows if "error" in r]
    inside = sum(bool(r["sim_within"]) for r in done)
    ideal_inside = sum(bool(r.get("ideal_within")) for r in done)
    has_ideal = any("ideal_mean" in r for r in done)
    check_seeds = len(done[0]["sim_values"]) if done else 0
    ideal_seeds = len(done[0].get("ideal_values", [])) if done else 0

    def ideal(r: dict[str, Any]) -> str:
        if "ideal_mean" not in r:
            return "–"
        return f"{r['ideal_mean']:.3f} ± {r['ideal_std']:.3f} ({'yes' if r['ideal_within'] else 'no'})"

    lines = [
        f"| {r['rule']} | {r['cluster_accuracy']:.3f} ({r['cluster_clock']}) | "
        f"{':'.join(f'{s:.1f}' for s in r['measured_speeds'])} | "
        f"{', '.join(str(c) for c in r.get('join_clocks', []))} | "
        f"{r['sim_mean']:.3f} ± {r['sim_std']:.3f} [{min(r['sim_values']):.3f}, {max(r['sim_values']):.3f}] | "
        f"**{'yes' if r['sim_within'] else 'no'}** | "
        + (f"{ideal(r)} | " if has_ideal else "")
        + f"{_staleness(r['cluster_staleness'])} | {_staleness(r['sim_staleness'])} |"
        for r in done
    ]
    header = (
        "| rule | real cluster (updates) | measured step-time ratios | cluster join clocks | simulator, measured "
        "speeds: mean ± std [min, max] | within | "
        + ("simulator, exact 1:1:2:4: mean ± std (within) | " if has_ideal else "")
        + "mean τ per worker, cluster | mean τ per worker, simulator |\n"
        + "|---|---|---|---|---|---|"
        + ("---|" if has_ideal else "")
        + "---|---|\n"
    )
    outside = [
        f"{r['rule']} ({r['cluster_accuracy']:.3f} against {r['sim_mean']:.3f} ± {r['sim_std']:.3f})"
        for r in done
        if not r["sim_within"]
    ]
    ran = f"Made with `{command}`. " if command else ""
    return (
        "## Real-cluster check\n\n"
        f"{ran}Each rule runs once over real gRPC with `psworker cluster` (4 worker processes slowed "
        "1×, 1×, 2×, 4×, one server, digits CNN, the time-to-target learning rates, until the server's clock "
        "reaches the update budget). The simulator then replays the same experiment: the step times are drawn "
        "from the ones that very cluster run measured (`--speeds profile:LOG_DIR`, from the workers' JSON logs: "
        "each sample is one worker's mean step time over 10 steps, compute, slow-down sleep and communication "
        "included; every step draws one of its worker's samples at random), and it stops at the cluster's final "
        "clock. In both, worker r draws its batches from a generator seeded `1000·seed + r`; the cluster runs "
        "seed 0, so its batch streams are exactly those of simulator seed 0. The other seeds change every "
        "worker's batch stream and the draws from the measured step times; the data split and the initial model "
        "stay fixed. What the simulator does not replay: the cluster's workers start one after another, so the "
        "first to connect updates the model alone for a while (the join clocks: the server's clock when each "
        "worker started; in the simulator all start at 0), and per-step jitter finer than the 10-step samples. "
        "Under SSP and BSP a measured step time includes the wait at the bound or the barrier, so the workers "
        "look equally fast and the replay of SSP does not follow the cluster's schedule (compare its staleness "
        "columns); BSP's accuracy does not depend on timing at all. "
        f"{check_seeds} simulator seeds per rule. 'Within' means the cluster's accuracy lies inside the "
        "simulator's seed range widened by one std on each side. "
        f"**{inside} of {len(done)} rules land within it.**"
        + (
            f" For comparison, the simulator with exact speed ratios 1:1:2:4 ({ideal_seeds} seeds) would put "
            f"{ideal_inside} of {len(done)} within."
            if has_ideal
            else ""
        )
        + (f" Outside: {'; '.join(outside)}." if outside else "")
        + (f" The cluster failed for: {', '.join(failed)}." if failed else "")
        + "\n\n"
        + header
        + "\n".join(lines)
        + "\n"
    )


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} seeds: the check needs at least one")
    return value


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tiny subset (the smoke test)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--doc", type=Path, default=None, help="markdown report (default OUT/reproduction.md)")
    parser.add_argument("--img-dir", type=Path, default=None, help="plots (default OUT)")
    parser.add_argument("--jobs", type=int, default=2, help="processes")
    parser.add_argument("--seeds", type=int, default=len(SEEDS))
    parser.add_argument(
        "--only", default=None, help="comma-separated experiment keys: agn,ab,ga,gem,ormo,ttt ('none': no experiments)"
    )
    parser.add_argument("--real-cluster", action="store_true", help="also run the gRPC check")
    parser.add_argument("--real-cluster-rules", default=None, help="comma-separated labels (default all)")
    parser.add_argument("--updates", type=int, default=400, help="updates per real-cluster run")
    parser.add_argument(
        "--check-seeds",
        type=_at_least_one,
        default=CHECK_SEEDS,
        help="simulator seeds per rule for the real-cluster check (measured speeds; exact 1:1:2:4 uses --seeds)",
    )
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
    command = None
    if args.real_cluster:
        rules = args.real_cluster_rules.split(",") if args.real_cluster_rules else None
        real = real_cluster_check(args.updates, range(args.check_seeds), seeds, args.out, rules, args.jobs)
        (args.out / "real_cluster.json").write_text(json.dumps(real, indent=1))
        command = "python -m benchmarks.reproduce " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    elapsed = time.perf_counter() - started
    summary = report(exps, results, args.out, img_dir, doc, args.quick, seeds, elapsed, real, command)
    for key, data in summary["experiments"].items():
        print(f"{key}: {data['verdict']}")
    print(f"done in {elapsed:.0f} s; report {doc}")


if __name__ == "__main__":
    main()
