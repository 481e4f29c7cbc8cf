"""The reproduction's real-cluster check: each rule once over real gRPC, then the simulator replaying that run.

The cluster's final accuracy is judged against the spread of simulator seeds that replay it with
the step times the cluster measured (``profile:LOG_DIR``); :func:`real_cluster_section` writes
the report's section. ``python -m experiments.reproduce --real-cluster`` runs it.
"""

from __future__ import annotations

import json
import multiprocessing
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.harness.processes import use_one_torch_thread
from experiments.repro_experiments import TIME_TO_TARGET_RULES
from pstools.simulate import SimConfig, SpeedModel, simulate

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


def replay_fields(prefix: str, runs: dict[int, dict[str, Any]], cluster_accuracy: float) -> dict[str, Any]:
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
    from pstools.launcher import ClusterConfig, ClusterError, run_cluster

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
        with multiprocessing.get_context("spawn").Pool(jobs, initializer=use_one_torch_thread) as pool:
            for label, kind, seed, summary in pool.imap_unordered(_run_check_sim, work):
                runs.setdefault((label, kind), {})[seed] = summary
    else:
        use_one_torch_thread()
        for job in work:
            label, kind, seed, summary = _run_check_sim(job)
            runs.setdefault((label, kind), {})[seed] = summary
    for label, row in rows.items():
        if "error" in row:
            continue
        row.update(replay_fields("sim", runs[(label, "profile")], row["cluster_accuracy"]))
        if (label, "ideal") in runs:
            row.update(replay_fields("ideal", runs[(label, "ideal")], row["cluster_accuracy"]))
        print(
            f"  {label}: cluster {row['cluster_accuracy']:.3f}, simulator (measured speeds) "
            f"{row['sim_mean']:.3f} ± {row['sim_std']:.3f}, within: {row['sim_within']}",
            flush=True,
        )
    return list(rows.values())


def _staleness(pairs: Sequence[Sequence[float]]) -> str:
    return " / ".join(f"{mean:.1f}" for mean, _ in pairs)


def real_cluster_section(rows: list[dict[str, Any]], command: str | None = None) -> str:
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
