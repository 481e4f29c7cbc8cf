"""Reproduce every paper's claim in the simulator; write JSON, PNG plots and a markdown report.

    python -m benchmarks.reproduce [--quick] [--out DIR] [--doc docs/reproduction.md] [--jobs 2]
    python -m benchmarks.reproduce --only none --real-cluster [--updates 300] [--check-seeds 8]
        # only the gRPC check: each rule on a real local cluster, then the simulator replaying it
        # with the step times that cluster measured (written to OUT/real_cluster.json)

Every run goes through the real shard and worker procedures (``pstools.simulate``), several
seeds per point; the report gives each claim, our numbers as mean ± std and a verdict. This
module runs and reports; the experiments are defined in ``repro_experiments``, plotted by
``repro_plots``, and the gRPC check lives in ``repro_real_cluster``.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.harness.processes import use_one_torch_thread
from benchmarks.repro_experiments import Aggregates, Experiment, Point, as_float, experiments
from benchmarks.repro_plots import plot
from benchmarks.repro_real_cluster import CHECK_SEEDS, real_cluster_check, real_cluster_section
from pstools.simulate import simulate

SEEDS = (0, 1, 2)


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
        with multiprocessing.get_context("spawn").Pool(jobs, initializer=use_one_torch_thread) as pool:
            for key, index, seed, summary in pool.imap_unordered(run_point, work):
                results[key].setdefault(index, {})[seed] = summary
                done += 1
                if done % 20 == 0:
                    print(f"  {done}/{len(work)} runs, {time.perf_counter() - started:.0f} s", flush=True)
    else:
        use_one_torch_thread()
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
        wall = sum(as_float(a["wall_s"]) for a in agg.values())
        sections.append(
            f"## {exp.title}\n\n**Paper.** {exp.paper}.\n\n**Claim.** {exp.claim}\n\n**Set-up.** {exp.setup} "
            f"{len(seeds)} seed(s) per point; {len(exp.points) * len(seeds)} runs, {wall:.0f} s of compute.\n\n"
            f"**Verdict: {verdict}.** {text}\n\n![{exp.title}]({rel.as_posix()})\n"
        )
    if real_cluster:
        sections.append(real_cluster_section(real_cluster, real_cluster_command))
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
