"""Time to accuracy on mixed-speed workers: PyTorch DDP against hetps BSP and every hetps rule.

    python -m experiments.time_to_accuracy [--quick | --smoke] [--out FILE]
        [--mixes 1:1:2:4,1:1:1:8,1:1:1:1] [--systems ddp,bsp,asgd,...] [--seeds 0,1,2]
        [--budget S] [--step-time S] [--lrs SWEEP.json[,SWEEP2.json]] [--link-mbit R]
    python -m experiments.time_to_accuracy --sweep [--systems ...] [--grid 0.005,0.02]   # the learning-rate sweep

The same task, data parts, per-worker batch, seeds and emulated speeds for every system: each
worker is a real process; hetps workers talk gRPC to a real ``psserver``; DDP ranks all-reduce
over gloo. A worker of slowdown X takes X · step-time seconds per step (psworker.pacing). Each
run lasts a fixed wall budget; the test accuracy is scored afterwards from parameter snapshots
(experiments.harness.snapshots). Per mix and system: median and spread over seeds of the seconds
until the test accuracy first reaches the target, the accuracy at the budget, samples per
second and per-worker staleness; an accuracy-vs-time plot (PNG) and JSON beside ``--out``.
``--link-mbit R`` races every system over one emulated link of R Mbit/s that all of its traffic
shares (experiments.harness.link: the kernel shapes the loopback device; needs root and tc).

Learning rates: ``--sweep`` runs every system at each rate of its grid on the first mix with a
seed kept apart from the measured ones (100); the measuring run gives each system the rate of
its best sweep run over every ``--lrs`` file (a sweep may be run in parts, e.g. a wider grid
where a rate won at the grid's edge): the one that reached the target soonest, else the best
accuracy at the budget. Without ``--lrs`` the rates are :data:`SWEPT_LRS` (the last sweep's),
and :data:`UNSWEPT_LRS` for systems no sweep has covered.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from benchmarks.harness.report import prepare_output, run_header
from benchmarks.harness.settings import parse_speed_mix as parse_mix
from experiments.harness.link import LinkUnavailableError, emulated_link
from experiments.harness.race import Race, RaceSettings, RunResult, System, race_once, scored_run
from experiments.harness.scoring import NICENESS, BackgroundScorer, Scored
from experiments.harness.snapshots import Score, score
from experiments.tta_report import aggregate, at_budget, local_sgd_targets, plot_curves, print_tables, targets
from pstasks.tasks import load_task
from psworker.task import ACCURACY, Metric, Task

SYSTEMS = {
    system.name: system
    for system in (
        System("ddp"),
        System("bsp", "momentum", "bsp"),
        System("asgd", "asgd"),
        System("momentum", "momentum"),
        System("sa", "sa"),
        System("dynsgd", "dynsgd"),
        System("gap-aware", "gap-aware"),
        System("ormo", "ormo"),
        System("agn", "agn"),
        System("gem", "gem"),
        # The local-SGD family: synchronous DiLoCo (BSP averages each round's pseudo-gradients),
        # naive asynchronous DiLoCo, Delayed Nesterov, each async one with and without DyLU.
        System("diloco-sync", "diloco", "bsp"),
        System("diloco", "diloco"),
        System("diloco+dylu", "diloco", options=("dylu=true",)),
        System("diloco-dn", "diloco-dn"),
        System("diloco-dn+dylu", "diloco-dn", options=("dylu=true",)),
        # With a pull grace that covers DyLU's rounding: two steps of a 1× worker (0.1 s at the
        # default --step-time), as in the simulator's reproduction.
        System("diloco-dn+dylu+grace", "diloco-dn", options=("dylu=true",), grace_steps=2.0),
    )
}
# The local-SGD systems the local-SGD targets judge (each against synchronous DiLoCo and the per-step rules).
LOCAL_SGD_CANDIDATES = ("diloco-dn+dylu", "diloco-dn+dylu+grace")
# One grid for every gradient-step system (a factor 4 apart); the DiLoCo rules' rate
# is the outer step ε on a pseudo-gradient, whose paper default is 0.7.
GRADIENT_GRID = (0.005, 0.02, 0.08)
OUTER_GRID = (0.35, 0.7, 1.0)
SWEEP_SEED = 100
# The rates the last sweeps chose on 1:1:2:4 (docs/benchmarks.md has their commands and every
# run): each is inside its grid but sa's, gap-aware's and dynsgd's, which won at the widened
# grid's top.
SWEPT_LRS: dict[str, float] = {
    "ddp": 0.08,
    "bsp": 0.08,
    "asgd": 0.08,
    "momentum": 0.005,
    "sa": 0.32,
    "gap-aware": 0.32,
    "dynsgd": 0.32,
    "ormo": 0.02,
    "agn": 0.005,
    "gem": 0.08,
    # The local-SGD sweep (outer rate ε; docs/benchmarks.md): naive async DiLoCo won at its grid's
    # bottom, so its best rate may be lower still.
    "diloco-sync": 0.7,
    "diloco": 0.04375,
    "diloco+dylu": 0.04375,
    "diloco-dn": 0.35,
    "diloco-dn+dylu": 0.35,
}
# Systems no sweep has covered yet run at these rates and the results name them as unswept
# (the grace variant at its twin's swept rate).
UNSWEPT_LRS: dict[str, float] = {"diloco-dn+dylu+grace": SWEPT_LRS["diloco-dn+dylu"]}
MIXES = ("1:1:2:4", "1:1:1:8", "1:1:1:1")


def is_local_sgd(system: System) -> bool:
    """Whether ``system`` pushes a pseudo-gradient after local steps (the DiLoCo rules)."""
    return system.rule.startswith("diloco")


def lr_grid(system: System) -> tuple[float, ...]:
    return OUTER_GRID if is_local_sgd(system) else GRADIENT_GRID


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one mix (1:1:2:4), one seed, five systems")
    parser.add_argument("--smoke", action="store_true", help="digits, two workers, seconds per run (tests)")
    parser.add_argument("--sweep", action="store_true", help="run the learning-rate sweep instead")
    parser.add_argument("--task", default=None, help="built-in task (default fashion; digits for --smoke)")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--mixes", default=None, help="comma-separated speed mixes, e.g. 1:1:2:4,1:1:1:1")
    parser.add_argument("--systems", default=None, help=f"comma-separated, of: {', '.join(SYSTEMS)}")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default 0,1,2)")
    parser.add_argument("--budget", type=float, default=None, help="wall seconds per run (default 60)")
    parser.add_argument("--step-time", type=float, default=None, help="seconds of a 1× step (default 0.05)")
    parser.add_argument("--snapshot-seconds", type=float, default=None, help="default 2 (0.5 for --smoke)")
    parser.add_argument(
        "--target",
        type=float,
        default=None,
        help="the task's metric to reach: test accuracy (default 0.88), or a loss for a loss task (required)",
    )
    parser.add_argument(
        "--lrs", default=None, help="comma-separated sweep JSON files: each system takes its best run's rate over all"
    )
    parser.add_argument("--grid", default=None, help="--sweep: comma-separated rates instead of each system's grid")
    parser.add_argument(
        "--score-between-races",
        action="store_true",
        help="score each run before the next race starts (default: beside it, at nice 19)",
    )
    parser.add_argument(
        "--link-mbit",
        type=_positive,
        default=None,
        help="race over one emulated link of this many Mbit/s shared by all traffic (needs root and tc)",
    )
    parser.add_argument("--out", type=Path, default=None)
    return parser


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def _settings(args: argparse.Namespace) -> tuple[RaceSettings, list[str], list[str], list[int]]:
    if args.smoke:
        mixes, systems, seeds = ["1:2"], ["ddp", "asgd"], [0]
        # Steps of 30 ms: long enough that a busy host still paces the slower worker at half speed.
        settings = RaceSettings("digits", args.data_dir, 0.03, 4.0, 0.5, 0.6)
    elif args.quick:
        mixes, systems, seeds = ["1:1:2:4"], ["ddp", "bsp", "asgd", "momentum", "gap-aware"], [0]
        settings = RaceSettings("fashion", args.data_dir, 0.05, 60.0, 2.0, 0.88)
    else:
        mixes, systems, seeds = list(MIXES), list(SYSTEMS), [0, 1, 2]
        settings = RaceSettings("fashion", args.data_dir, 0.05, 60.0, 2.0, 0.88)
    # A setting given on the command line (a value, not 0 or empty) replaces the preset's.
    given = {
        "task": args.task,
        "budget_seconds": args.budget,
        "step_seconds": args.step_time,
        "snapshot_seconds": args.snapshot_seconds,
        "target": args.target,
        "link_mbit": args.link_mbit,
    }
    settings = replace(settings, **{field: value for field, value in given.items() if value})
    if args.mixes:
        mixes = args.mixes.split(",")
    if args.systems:
        systems = args.systems.split(",")
    if args.seeds:
        seeds = [int(s) for s in args.seeds.split(",")]
    return settings, mixes, systems, seeds


def _check(parser: argparse.ArgumentParser, mixes: Sequence[str], systems: Sequence[str]) -> None:
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        parser.error(f"unknown system(s) {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}")
    for mix in mixes:
        try:
            parse_mix(mix)
        except argparse.ArgumentTypeError as error:
            parser.error(str(error))


def _sweep_order(run: dict[str, Any], metric: Metric) -> tuple[bool, float, float]:
    """Soonest at the target first; among runs that never reached it, the best metric at the budget."""
    reached = run["time_to_target"]
    value = metric.worst if run["diverged"] else metric.of(run["accuracy_at_budget"], run["loss_at_budget"])
    return (reached is None, reached or 0.0, -value if metric.higher_is_better else value)


def choose_lrs(sweeps: Sequence[dict[str, Any]], metric: Metric = ACCURACY) -> dict[str, float]:
    """Per system, the rate of its best run over every sweep given (a sweep may be run in parts)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for sweep_results in sweeps:
        for run in sweep_results["runs"]:
            runs.setdefault(run["system"], []).append(run)
    return {
        system: float(min(tried, key=lambda run: _sweep_order(run, metric))["lr"]) for system, tried in runs.items()
    }


def _learning_rates(
    args: argparse.Namespace, parser: argparse.ArgumentParser, metric: Metric
) -> tuple[dict[str, float], set[str]]:
    """Each system's rate, and which systems' rates come from a sweep."""
    if args.lrs is None:
        return {**UNSWEPT_LRS, **SWEPT_LRS}, set(SWEPT_LRS)
    sweeps = []
    for name in args.lrs.split(","):
        try:
            sweeps.append(json.loads(Path(name).read_text()))
            sweeps[-1]["runs"]
        except (OSError, ValueError, KeyError) as error:
            parser.error(f"--lrs {name}: not a sweep's results file ({error})")
    chosen = choose_lrs(sweeps, metric)
    return {**UNSWEPT_LRS, **SWEPT_LRS, **chosen}, set(SWEPT_LRS) | set(chosen)


def _line(console: Console, result: RunResult, metric: Metric) -> None:
    reached = f"{result.time_to_target:.1f} s" if result.time_to_target is not None else "not reached"
    console.print(
        f"  {result.system:>10} lr {result.lr:g} mix {':'.join(f'{s:g}' for s in result.slowdowns)} "
        f"seed {result.seed}: target {reached}, {metric.name} at budget {at_budget(result, metric):.4f}, "
        f"{result.samples_per_second:.0f} samples/s ({result.run_seconds:.0f} s: "
        f"{result.setup_seconds:.0f} s start; {result.scoring_seconds:.0f} s scoring)"
    )


@dataclass(frozen=True)
class Job:
    system: str
    lr: float
    mix: str
    seed: int
    directory: Path


def race_all(
    jobs: Sequence[Job], settings: RaceSettings, task: Task, console: Console, scorer: BackgroundScorer | None
) -> list[RunResult]:
    """Race the jobs one after another. With a scorer each run is scored beside the next race;
    without one, before it starts. Results come in the jobs' order."""
    raced: list[tuple[Race, Future[Scored] | None]] = []
    results: list[RunResult] = []

    def report(index: int, scored: Score, seconds: float) -> None:
        results.append(scored_run(raced[index][0], scored, seconds, settings))
        _line(console, results[-1], task.metric)

    for job in jobs:
        race = race_once(SYSTEMS[job.system], job.lr, parse_mix(job.mix), job.seed, settings, task, job.directory)
        if scorer is None:
            began = time.monotonic()
            raced.append((race, None))
            report(len(raced) - 1, score(task, race.snapshots, settings.target), time.monotonic() - began)
            continue
        raced.append((race, scorer.submit(race.snapshots, settings.target, job.directory / "snapshots.pt")))
        race.snapshots = []
        while len(results) < len(raced) and (pending := raced[len(results)][1]) is not None and pending.done():
            report(len(results), *pending.result()[:2])
    for index in range(len(results), len(raced)):
        pending = raced[index][1]
        assert pending is not None
        report(index, *pending.result()[:2])
    return results


def sweep_jobs(mix: str, systems: Sequence[str], grid: Sequence[float] | None, log_dir: Path) -> list[Job]:
    """Every system at each rate of its grid (or of ``grid``) on ``mix``, seed :data:`SWEEP_SEED`."""
    return [
        Job(name, lr, mix, SWEEP_SEED, log_dir / f"sweep-{name}-{lr:g}")
        for name in systems
        for lr in grid or lr_grid(SYSTEMS[name])
    ]


def sweep_results(mix: str, runs: Sequence[RunResult], metric: Metric) -> dict[str, Any]:
    results = {"mix": mix, "seed": SWEEP_SEED, "runs": [asdict(run) for run in runs]}
    return results | {"chosen_lrs": choose_lrs([results], metric)}


def measure_jobs(
    mixes: Sequence[str], systems: Sequence[str], seeds: Sequence[int], lrs: dict[str, float], log_dir: Path
) -> list[Job]:
    """Every system on every mix and seed; seeds outermost, so slow drifts of the machine spread evenly."""
    return [
        Job(name, lrs[name], mix, seed, log_dir / f"{mix.replace(':', '-')}-{name}-{seed}")
        for mix in mixes
        for seed in seeds
        for name in systems
    ]


def _measured_targets(summary: dict[str, Any], metric: Metric) -> list[dict[str, Any]]:
    """The targets a measurement is judged by, on the 1:1:2:4 mix: the per-step systems', then
    each local-SGD candidate's against synchronous DiLoCo."""
    per_step = [name for name, system in SYSTEMS.items() if not system.is_ddp and not is_local_sgd(system)]
    return targets(summary, "1:1:2:4", metric) + [
        goal
        for candidate in LOCAL_SGD_CANDIDATES
        for goal in local_sgd_targets(summary, "1:1:2:4", candidate, "diloco-sync", per_step)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    settings, mixes, systems, seeds = _settings(args)
    _check(parser, mixes, systems)
    task = load_task(settings.task, settings.data_dir)
    metric = task.metric
    if args.target is None and not metric.higher_is_better:
        parser.error(f"task {settings.task} is judged by {metric.label}: give the value to reach with --target")
    try:
        with emulated_link(settings.link):
            pass
    except LinkUnavailableError as error:
        parser.error(f"--link-mbit: {error}")
    default_name = "time_to_accuracy_sweep" if args.sweep else "time_to_accuracy"
    out: Path = args.out or Path(f"experiments/results/{default_name}.json")
    console, log_dir = prepare_output(out)
    # The runs' workers have one thread each; scoring in between may use the whole machine.
    torch.set_num_threads(2)
    began = time.monotonic()
    results: dict[str, Any] = {
        **run_header(None),
        "race": asdict(settings),
        "mixes": mixes,
        "systems": {
            name: asdict(SYSTEMS[name]) | {"rule_options": list(SYSTEMS[name].rule_options(settings.step_seconds))}
            for name in systems
        },
        "seeds": seeds,
    }
    scorer = None if args.score_between_races else BackgroundScorer(settings.task, settings.data_dir)
    results["scoring"] = "between races" if scorer is None else f"beside the next race, at nice {NICENESS}"
    try:
        if args.sweep:
            grid = [float(rate) for rate in args.grid.split(",")] if args.grid else None
            jobs = sweep_jobs(mixes[0], systems, grid, log_dir)
            results |= sweep_results(mixes[0], race_all(jobs, settings, task, console, scorer), metric)
            console.print(f"chosen learning rates: {results['chosen_lrs']}")
        else:
            lrs, swept = _learning_rates(args, parser, metric)
            results["lrs"] = {name: lrs[name] for name in systems}
            results["unswept"] = [name for name in systems if name not in swept]
            runs = race_all(measure_jobs(mixes, systems, seeds, lrs, log_dir), settings, task, console, scorer)
            summary = aggregate(runs, metric)
            results["metric"] = metric.name
            results["runs"] = [asdict(r) for r in runs]
            results["summary"] = summary
            results["targets"] = _measured_targets(summary, metric)
            print_tables(summary, results["targets"], settings, console, metric)
            plot = out.with_suffix(".png")
            plot_curves(runs, settings, plot, metric)
            results["plot"] = str(plot)
    finally:
        if scorer is not None:
            scorer.close()
    results["wall_seconds"] = time.monotonic() - began
    arguments = argv if argv is not None else sys.argv[1:]
    results["command"] = " ".join(["python -m experiments.time_to_accuracy", *arguments])
    out.write_text(json.dumps(results, indent=2, default=_json_default))
    console.print(f"wrote {out} ({results['wall_seconds']:.0f} s)")
    return 0


def _json_default(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


if __name__ == "__main__":
    sys.exit(main())
