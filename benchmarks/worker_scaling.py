"""Aggregate steps/s of 1, 4 and 16 worker processes on one hetps shard (ASGD, fp32).

    python -m benchmarks.worker_scaling [--quick] [--out benchmarks/results/worker_scaling.json]

One hetps server per model (ResNet-18 size and ~100k parameters), each worker a process of its
own. Per level an untimed warm-up burst, then timed bursts, levels in alternating order; per
burst the server's CPU per step and the cores the server and the workers kept busy, so the
table shows how far the machine, not hetps, bounds the aggregate. Target: the most workers'
aggregate at least the single worker's, with no errors and finite parameters.
Also the ``concurrency`` section of ``python -m benchmarks.throughput``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from benchmarks.harness.pool import PoolTarget, WorkerPool
from benchmarks.harness.processes import Fleet, HetpsJob, cpu_of, cpu_seconds, vm_mb
from benchmarks.harness.report import (
    parse_settings,
    prepare_output,
    print_targets,
    run_header,
    spread,
    target,
    write_results,
)
from benchmarks.harness.settings import TORCH_THREADS, Settings
from benchmarks.harness.stats import scaled, summarize
from benchmarks.harness.steps import initialize_parameters
from psserver.allocator import WORKER, apply_allocator


def scaling_targets(settings: Settings, addresses: dict[str, str]) -> list[PoolTarget]:
    """A pool target per model on its 1-shard server (``addresses``: model to address)."""
    return [PoolTarget(model, model, (addresses[model],), max(settings.concurrency)) for model in settings.models]


def measure_concurrency(
    settings: Settings, pool: WorkerPool, targets: list[PoolTarget], pids: dict[str, int], console: Console
) -> dict[str, Any]:
    """Bursts of 1, 4, 16 workers on each target, the order reversed every other repeat.

    An untimed warm-up burst per level (fewest workers first) goes before: the server's heap
    grows to its working size there, so first-touch page faults fall on no measured level, and
    the server's peak RSS read after each warm-up burst shows how memory grows with workers.
    """
    results: dict[str, Any] = {}
    peak_rss: dict[tuple[str, int], float] = {}
    raw: dict[tuple[str, int], list[float]] = {}
    errors: dict[tuple[str, int], int] = {}
    first_errors: dict[tuple[str, int], str] = {}
    finite: dict[tuple[str, int], bool] = {}
    latencies: dict[tuple[str, int], list[float]] = {}
    # Cores kept busy by the server and every pool process (idle ones included) per burst, and the
    # server's CPU per step: how far the machine, not hetps, bounds the aggregate.
    busy: dict[tuple[str, int], list[float]] = {}
    server_per_step: dict[tuple[str, int], list[float]] = {}
    with console.status("concurrency") as status:
        for target in targets:
            for workers in settings.concurrency:
                status.update(f"concurrency: warming up {target.model} with {workers} workers")
                pool.burst(target.key, workers, max(0.2, settings.concurrency_seconds / 4))
                peak_rss[(target.model, workers)] = vm_mb(pids[target.addresses[0]], "VmHWM")
        for repeat in range(settings.concurrency_repeats):
            for target in targets:
                order = settings.concurrency if repeat % 2 == 0 else tuple(reversed(settings.concurrency))
                for workers in order:
                    status.update(f"concurrency: {target.model}, {workers} workers, repeat {repeat + 1}")
                    server_before = cpu_seconds(pids[target.addresses[0]])
                    workers_before = cpu_of(pool.pids)
                    started = time.perf_counter()
                    reports = pool.burst(target.key, workers, settings.concurrency_seconds)
                    wall = time.perf_counter() - started
                    key = (target.model, workers)
                    server_cpu = cpu_seconds(pids[target.addresses[0]]) - server_before
                    workers_cpu = cpu_of(pool.pids) - workers_before
                    busy.setdefault(key, []).append((server_cpu + workers_cpu) / wall)
                    steps = sum(int(r["steps"]) for r in reports)
                    server_per_step.setdefault(key, []).append(server_cpu / max(1, steps))
                    raw.setdefault(key, []).append(sum(r["steps"] / r["elapsed"] for r in reports))
                    errors[key] = errors.get(key, 0) + sum(int(r["errors"]) for r in reports)
                    first_errors.setdefault(key, next((r["error"] for r in reports if r["error"]), ""))
                    finite[key] = finite.get(key, True) and all(bool(r["finite"]) for r in reports)
                    latencies.setdefault(key, []).extend(r["elapsed"] / r["steps"] for r in reports if r["steps"])
    for target in targets:
        single = raw[(target.model, settings.concurrency[0])]
        levels: dict[str, Any] = {}
        for workers in settings.concurrency:
            key = (target.model, workers)
            levels[str(workers)] = {
                "aggregate_steps_per_s": summarize(raw[key]),
                "vs_single_worker": summarize([a / s for a, s in zip(raw[key], single, strict=True)]),
                "seconds_per_step_per_worker": summarize(latencies[key]),
                "errors": errors[key],
                "first_error": first_errors[key],
                "parameters_finite": finite[key],
                "server_peak_rss_mb_after_warm_up": peak_rss[key],
                "cores_busy": summarize(busy[key]),
                "server_cpu_ms_per_step": scaled(summarize(server_per_step[key]), 1e3),
            }
        results[target.model] = {"server": target.addresses[0], "rule": "asgd", "workers": levels}
    return results


def concurrency_targets(settings: Settings, concurrency: dict[str, Any]) -> list[dict[str, Any]]:
    """The most workers' aggregate at least the single worker's, without errors, per model."""
    targets = []
    most = max(settings.concurrency)
    for name, data in concurrency.items():
        level = data["workers"][str(most)]
        entry = target(f"{name}: {most} workers aggregate vs 1 worker", level["vs_single_worker"], 1.0, True)
        if level["errors"] or not level["parameters_finite"]:
            entry["pass"] = False
        entry["detail"] = f"errors={level['errors']}"
        targets.append(entry)
    return targets


def print_concurrency_table(concurrency: dict[str, Any], console: Console) -> None:
    for model, data in concurrency.items():
        table = Table(title=f"Concurrent workers on one hetps shard (asgd, fp32), {model}")
        columns = (
            "workers",
            "aggregate steps/s",
            "min–max",
            "vs 1 worker",
            "s/step per worker",
            "errors",
            "server peak RSS MB",
            "server CPU ms/step",
            "cores busy",
        )
        for column in columns:
            table.add_column(column, justify="right")
        for workers, level in data["workers"].items():
            aggregate = level["aggregate_steps_per_s"]
            table.add_row(
                workers,
                f"{aggregate['median']:.1f}",
                spread(aggregate),
                f"{level['vs_single_worker']['median']:.2f}",
                f"{level['seconds_per_step_per_worker']['median']:.3f}",
                str(level["errors"]),
                f"{level['server_peak_rss_mb_after_warm_up']:.0f}",
                f"{level['server_cpu_ms_per_step']['median']:.1f}",
                f"{level['cores_busy']['median']:.2f}",
            )
        console.print(table)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    settings, out = parse_settings("worker_scaling", __doc__, argv)
    console, log_dir = prepare_output(out)
    torch.set_num_threads(TORCH_THREADS)
    started = time.perf_counter()
    results = run_header(settings)
    fleet = Fleet(log_dir)
    try:
        with console.status("starting servers"):
            jobs = [HetpsJob(f"hetps-{model}-1shard", model, "asgd", (), 0, 1) for model in settings.models]
            by_label = fleet.start_all(jobs)
            addresses = {model: by_label[f"hetps-{model}-1shard"].address for model in settings.models}
            for model, address in addresses.items():
                initialize_parameters(model, [address])
        targets = scaling_targets(settings, addresses)
        with console.status("starting worker processes"):
            pool = WorkerPool(max(settings.concurrency), targets)
        try:
            pids = {server.address: server.pid for server in fleet.servers}
            results["concurrency"] = measure_concurrency(settings, pool, targets, pids, console)
        finally:
            pool.close()
    finally:
        fleet.stop()
    results["targets"] = concurrency_targets(settings, results["concurrency"])
    results["wall_seconds"] = time.perf_counter() - started
    print_concurrency_table(results["concurrency"], console)
    print_targets(results["targets"], console)
    write_results("worker_scaling", argv, results, out, console)
    return results


if __name__ == "__main__":
    apply_allocator(WORKER)
    main()
