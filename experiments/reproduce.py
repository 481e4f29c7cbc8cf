"""Reproduce every paper's claim in the simulator; write JSON, PNG plots and a markdown report.

    python -m experiments.reproduce [--quick] [--out DIR] [--doc docs/reproduction.md] [--jobs 2]
        [--tasks digits,fashion] [--only ab32,ttt-fashion,...]
    python -m experiments.reproduce --only none --reuse A/reproduction.json,B/reproduction.json \\
        --keep docs/reproduction.md --doc docs/reproduction.md --img-dir docs/img
        # one report from earlier runs (each section names its command), nothing re-run
    python -m experiments.reproduce --only none --real-cluster [--updates 300] [--check-seeds 8]
        # only the gRPC check: each rule on a real local cluster, then the simulator replaying it
        # with the step times that cluster measured (written to OUT/real_cluster.json)

Every run goes through the real shard and worker procedures (``pstools.simulate``), several
seeds per point; the report gives each claim, our numbers as mean ± std and a verdict. This
module runs them; the experiments are listed in ``repro_catalog`` (digits in ``repro_experiments``,
Fashion-MNIST in ``repro_fashion``, the AB learning-rate sweep in ``repro_ab_sweep``), the report is
written by ``repro_report`` and plotted by ``repro_plots``, and the gRPC check lives in
``repro_real_cluster``.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.harness.processes import use_one_torch_thread
from experiments.repro_catalog import TASKS, experiments
from experiments.repro_common import Experiment, Point
from experiments.repro_real_cluster import CHECK_SEEDS, real_cluster_check, real_cluster_section
from experiments.repro_report import Outcome, kept_sections, load_reused, report
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
            # The task's metric at the end (accuracy, or validation loss: infinite when diverged).
            "metric_value": result.metric_value if math.isfinite(result.metric_value) else None,
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
            done += 1
            if done % 10 == 0:
                print(f"  {done}/{len(work)} runs, {time.perf_counter() - started:.0f} s", flush=True)
    return results


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} seeds: the check needs at least one")
    return value


def _paths(text: str) -> list[Path]:
    paths = [Path(p.strip()) for p in text.split(",") if p.strip()]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing or not paths:
        raise argparse.ArgumentTypeError(f"no such results file: {', '.join(missing) or repr(text)}")
    return paths


def _task_list(text: str) -> list[str]:
    tasks = [t.strip() for t in text.split(",") if t.strip()]
    unknown = sorted(set(tasks) - set(TASKS))
    if unknown or not tasks:
        raise argparse.ArgumentTypeError(f"unknown task(s) {unknown or [text]}; choose from {','.join(TASKS)}")
    return tasks


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tiny subset (the smoke test)")
    parser.add_argument("--out", type=Path, default=Path("experiments/results"))
    parser.add_argument("--doc", type=Path, default=None, help="markdown report (default OUT/reproduction.md)")
    parser.add_argument("--img-dir", type=Path, default=None, help="plots (default OUT)")
    parser.add_argument("--jobs", type=int, default=2, help="processes")
    parser.add_argument("--seeds", type=int, default=len(SEEDS))
    parser.add_argument(
        "--only",
        default=None,
        help="comma-separated experiment keys: agn,ab,ab32,ga,gem,ormo,ttt, each also with -fashion ('none': none)",
    )
    parser.add_argument(
        "--tasks",
        type=_task_list,
        default=list(TASKS),
        help=f"comma-separated task families to reproduce on: {','.join(TASKS)} (default both)",
    )
    parser.add_argument(
        "--reuse",
        type=_paths,
        default=[],
        help="comma-separated results JSON of earlier runs: their experiments are reported again, not re-run",
    )
    parser.add_argument(
        "--keep", type=Path, default=None, help="an earlier report: its sections that no experiment here replaces stay"
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
    catalog = experiments(args.quick, None)
    reused = load_reused(args.reuse, catalog)
    kept = kept_sections(args.keep) if args.keep else None
    done_before = {o.exp.key for o in reused}
    exps = [e for e in experiments(args.quick, only, args.tasks) if e.key not in done_before]
    command = "python -m experiments.reproduce " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    started = time.perf_counter()
    print(f"{sum(len(e.points) for e in exps) * len(seeds)} runs in {len(exps)} experiments", flush=True)
    results = run_all(exps, args.jobs, seeds)
    extra = []
    if args.real_cluster:
        rules = args.real_cluster_rules.split(",") if args.real_cluster_rules else None
        real = real_cluster_check(args.updates, range(args.check_seeds), seeds, args.out, rules, args.jobs)
        (args.out / "real_cluster.json").write_text(json.dumps(real, indent=1))
        extra.append(real_cluster_section(real, command))
    elapsed = time.perf_counter() - started
    outcomes = reused + [Outcome(e, results[e.key], command, elapsed, args.quick) for e in exps]
    summary = report(outcomes, catalog, args.out, img_dir, doc, command, kept, extra)
    for key, data in summary["experiments"].items():
        print(f"{key}: {data['verdict']}")
    print(f"done in {elapsed:.0f} s; report {doc}")


if __name__ == "__main__":
    main()
