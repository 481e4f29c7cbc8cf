"""Throughput of hetps against the transport's ceiling, a torch.distributed.rpc peer and torch.optim, in one run.

    python -m benchmarks.throughput [--quick] [--repeats N] [--out benchmarks/results/throughput.json]

The full run: every measurement below on one set of servers, so each server's memory is
followed across all of them. Everything runs on loopback, each server in its own process and
every client in this one (the worker processes that load the servers in their own).
Sections, each also a script of its own (``python -m benchmarks.NAME``):

1. **steps** (``step_round_trip``) — a worker step (push a gradient, get the parameters back)
   for a ResNet-18-sized model (11,689,512 fp32 parameters) and a ~100k-parameter model
   through: hetps (1 and 2 shards, fp32 and bf16 on the wire); a bare gRPC byte mover with
   the same chunking (``benchmarks.harness.bare_grpc``, the transport's ceiling); and a
   ``torch.distributed.rpc`` parameter server (``benchmarks.harness.torch_rpc_peer``, TensorPipe
   over TCP, fp32), and the same peer on TensorPipe's default channels as a reference row.
   Systems are interleaved step by step, so ratios compare like with like on a busy machine.
2. **load** — 16 worker processes pushing at once to each model's 1-shard server, so the memory
   section reads its peak under load (how the push rate grows with workers, up to 512 under each
   consistency, is ``benchmarks.scale``'s workers axis).
3. **apply** (``rule_apply``) — server-side apply time of every update rule on 11.7M
   parameters against ``torch.optim.SGD(momentum=0.9, fused=True)``, interleaved sample by
   sample.
4. **memory** (``server_memory``) — peak RSS (VmHWM) of every hetps server against the bytes
   it must hold (parameters + rule state + one snapshot per worker for rules that need
   snapshots).

Prints one table per section and the targets with PASS/MISS, or INVALID where the baseline a
step target is judged against was out of line (``benchmarks.harness.validity``: the JSON's
``validity`` says which check failed and why); writes medians, spreads and ratios as JSON.
``--quick`` is a shorter run; ``--smoke`` (tests) a tiny one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from benchmarks.harness.pool import PoolTarget, WorkerPool
from benchmarks.harness.processes import Fleet, vm_mb
from benchmarks.harness.report import (
    parse_settings,
    prepare_output,
    print_targets,
    print_validity,
    run_header,
    write_results,
)
from benchmarks.harness.settings import TORCH_THREADS, Settings
from benchmarks.harness.step_systems import Comparisons, hetps_addresses, hetps_jobs, start_comparisons
from benchmarks.harness.step_tables import print_step_limits, print_step_tables
from benchmarks.harness.steps import initialize_parameters
from benchmarks.rule_apply import apply_targets, measure_apply, print_apply_table
from benchmarks.server_memory import gap_aware_job, load_gap_aware, measure_memory, memory_targets, print_memory_table
from benchmarks.step_round_trip import measure_steps, step_limits, step_targets, step_validity
from psserver.allocator import WORKER, apply_allocator


def run(settings: Settings, log_dir: Path, console: Console) -> dict[str, Any]:
    torch.set_num_threads(TORCH_THREADS)
    fleet = Fleet(log_dir)
    started = time.perf_counter()
    results = run_header(settings)
    comparisons: Comparisons | None = None
    # First, while no server runs: the apply section is the most sensitive to memory bandwidth.
    results["apply"] = measure_apply(settings, console)
    try:
        with console.status("starting servers"):
            gap_job = gap_aware_job(settings)
            by_label = fleet.start_all([*hetps_jobs(settings), gap_job])
            hetps = hetps_addresses(settings, by_label)
            gap = by_label[gap_job.label]
            gap_target = PoolTarget("gap-aware", gap.model, (gap.address,), settings.rss_workers)
            comparisons = start_comparisons(fleet)
        server_pids = {server.address: server.pid for server in fleet.servers} | comparisons.pids()
        movers = comparisons.mover_addresses()
        results["steps"] = measure_steps(settings, hetps, movers, server_pids, console, comparisons.remote)
        fleet.checkpoint("steps")
        peer_peaks = {p.label: vm_mb(p.pid, "VmHWM") for p in (comparisons.peer, comparisons.peer_default)}
        comparisons.leave()
        comparisons = None
        initialize_parameters(gap_target.model, list(gap_target.addresses))
        most = max(settings.concurrency)
        targets = [PoolTarget(model, model, (hetps[model][("hetps", 1)][0],), most) for model in settings.models]
        with console.status("starting worker processes"):
            pool = WorkerPool(max(most, settings.rss_workers), [*targets, gap_target])
        fleet.checkpoint("workers joined")
        try:
            results["load"] = {}
            for pool_target in targets:
                with console.status(f"{pool_target.model} server under {most} workers"):
                    reports = pool.burst(pool_target.key, most, settings.rss_seconds)
                results["load"][pool_target.model] = {
                    "workers": most,
                    "aggregate_steps_per_s": sum(r["steps"] / r["elapsed"] for r in reports),
                    "errors": sum(int(r["errors"]) for r in reports),
                }
            fleet.checkpoint("load")
            results["gap_aware_load"] = load_gap_aware(settings, pool, console)
        finally:
            pool.close()
        loaded = {t.addresses[0]: t.workers for t in [*targets, gap_target]}
        for server in fleet.servers:
            # The most workers that pushed to a server at once (the step section's clients take turns).
            server.workers = loaded.get(server.address, 1)
        results["memory"] = measure_memory(fleet)
        for label, peak in peer_peaks.items():
            results["memory"]["servers"][label]["peak_rss_mb"] = peak
    finally:
        if comparisons is not None:
            comparisons.leave(graceful=False)
        fleet.stop()
    results["validity"] = step_validity(settings, results["steps"])
    results["targets"] = [
        *step_targets(settings, results["steps"], results["validity"]),
        *apply_targets(results["apply"]),
        *memory_targets(results["memory"]),
    ]
    results["limits"] = step_limits(results["steps"], results["validity"])
    results["wall_seconds"] = time.perf_counter() - started
    return results


def print_tables(results: dict[str, Any], console: Console) -> None:
    print_step_tables(results["steps"], console)
    print_step_limits(results["limits"], console)
    print_apply_table(results["apply"], console)
    print_memory_table(results["memory"], console)
    print_validity(results["validity"], console)
    print_targets(results["targets"], console)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    settings, out = parse_settings("throughput", __doc__, argv, repeats=True)
    console, log_dir = prepare_output(out)
    results = run(settings, log_dir, console)
    print_tables(results, console)
    write_results("throughput", argv, results, out, console)
    return results


if __name__ == "__main__":
    apply_allocator(WORKER)
    main()
