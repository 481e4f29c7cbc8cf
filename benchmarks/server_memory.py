"""Peak RSS (VmHWM) of hetps servers against the bytes they must hold, under concurrent workers.

    python -m benchmarks.server_memory [--quick] [--out benchmarks/results/server_memory.json]
        [--server-config server.toml]

What a server must hold: its parameters, its rule's state (``state_tensors``: the momentum
buffer, gap-aware's average gap...) and, for a rule whose equation reads θ at each worker's
pulled clock (``needs_snapshot``: gap-aware, DC-ASGD), one snapshot per worker:

    must hold = 4 B x shard length x (1 + rule state tensors + workers if the rule needs snapshots)

Here: an ASGD server per model loaded by the largest concurrency level's worker processes at
once (16), a gap-aware server (momentum 0.9) on the reference model loaded by ``rss_workers``
(4), and an ASGD server of a 124M-parameter model (GPT-2 small's shapes, 496 MB) loaded by 16
workers at once, eight to a process sharing one update (``benchmarks.harness.pool``); peaks are
read when the workers have joined and after each load, and each ASGD server's RSS is traced
through its load (where the peak falls). Target
per hetps server: peak RSS at most 2x what it must hold plus 350 MB. The ``memory`` section
of ``python -m benchmarks.throughput`` reads the same for every server of the full run (the
bare mover and the peer included), after its steps, workers joined and concurrency phases.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from benchmarks.harness.memory import RSS_FACTOR, RSS_SLACK_MB, RssTrace, rss_limit_mb, rule_state_bytes
from benchmarks.harness.models import MODELS
from benchmarks.harness.pool import PoolTarget, WorkerPool
from benchmarks.harness.processes import Fleet, HetpsJob, ServerProcess, vm_mb
from benchmarks.harness.refusals import refused_during, rejected_requests
from benchmarks.harness.report import parse_settings, prepare_output, print_targets, run_header, target, write_results
from benchmarks.harness.settings import TORCH_THREADS, Settings
from benchmarks.harness.steps import initialize_parameters
from pscli.config_file import merged, read_toml
from psproto.layout import Layout
from psserver.allocator import WORKER, apply_allocator


def gap_aware_job(settings: Settings) -> HetpsJob:
    """The gap-aware server: the rule that keeps the most per worker (a snapshot each)."""
    return HetpsJob(f"hetps-{settings.reference}-gap-aware", settings.reference, "gap-aware", ("momentum=0.9",), 0, 1)


def load_gap_aware(settings: Settings, pool: WorkerPool, console: Console) -> dict[str, Any]:
    """``rss_workers`` workers pushing to the gap-aware server (pool key ``gap-aware``) at once."""
    with console.status("gap-aware server under load"):
        reports = pool.burst("gap-aware", settings.rss_workers, settings.rss_seconds)
    return {
        "workers": settings.rss_workers,
        "aggregate_steps_per_s": sum(r["steps"] / r["elapsed"] for r in reports),
        "errors": sum(int(r["errors"]) for r in reports),
    }


MUST_HOLD = "parameters + rule state + one snapshot per worker if the rule needs them (4 B per element each)"


def measure_memory(fleet: Fleet) -> dict[str, Any]:
    """Every server's peak RSS, and for hetps servers what they must hold and the limit that gives."""
    servers: dict[str, Any] = {}
    order = {"hetps": 0, "bare": 1, "peer": 2}
    for server in sorted(fleet.servers, key=lambda s: (order[s.kind], s.label)):
        alive = server.process.poll() is None
        entry: dict[str, Any] = {
            "kind": server.kind,
            "pid": server.pid,
            "rss_at_start_mb": server.rss_at_start_mb,
            "peak_rss_mb_after": dict(server.peak_rss_after),
            "peak_rss_mb": vm_mb(server.pid, "VmHWM") if alive else math.nan,
        }
        if server.kind == "hetps":
            layout = Layout.from_named_shapes(MODELS[server.model](), server.num_shards)
            length = layout.shard(server.shard_index).length
            state, needs_snapshot = rule_state_bytes(server.rule, server.rule_opts, length)
            params = length * 4
            snapshots = params * server.workers if needs_snapshot else 0
            must_hold_mb = (params + state + snapshots) / 1e6
            limit_mb = rss_limit_mb(must_hold_mb)
            entry.update(
                {
                    "model": server.model,
                    "rule": server.rule,
                    "rule_opts": list(server.rule_opts),
                    "shard": f"{server.shard_index + 1}/{server.num_shards}",
                    "max_concurrent_workers": server.workers,
                    "params_mb": params / 1e6,
                    "rule_state_mb": state / 1e6,
                    "snapshots_mb": snapshots / 1e6,
                    "must_hold_mb": must_hold_mb,
                    "limit_mb": limit_mb,
                    "peak_over_must_hold": entry["peak_rss_mb"] / must_hold_mb,
                }
            )
        servers[server.label] = entry
    return {
        "servers": servers,
        "rule": f"peak RSS <= {RSS_FACTOR:g} x must-hold + {RSS_SLACK_MB:.0f} MB",
        "must_hold": MUST_HOLD,
    }


def memory_targets(memory: dict[str, Any]) -> list[dict[str, Any]]:
    """Each hetps server's peak RSS within its limit."""
    targets = []
    for label, server in memory["servers"].items():
        if server["kind"] != "hetps":
            continue
        peak = server["peak_rss_mb"]
        summary = {"median": peak, "min": peak, "max": peak, "q1": peak, "q3": peak, "n": 1}
        detail = f"must hold {server['must_hold_mb']:.0f} MB ({server['max_concurrent_workers']} workers)"
        targets.append(target(f"peak RSS MB, {label}", summary, server["limit_mb"], False, detail))
    return targets


def print_memory_table(memory: dict[str, Any], console: Console) -> None:
    table = Table(title="Peak server RSS (VmHWM) against what each server must hold")
    # The phases the run recorded, in their order (the full run: steps, workers joined, concurrency).
    phases = list(
        dict.fromkeys(phase for server in memory["servers"].values() for phase in server["peak_rss_mb_after"])
    )
    first = ("server", "rule", "workers", "must hold MB", "RSS at start MB")
    for column in (*first, *(f"peak after {phase}" for phase in phases), "peak RSS MB", "limit MB"):
        table.add_column(column, justify="left" if column in ("server", "rule") else "right")
    for label, server in memory["servers"].items():
        hetps = server["kind"] == "hetps"
        after = server["peak_rss_mb_after"]
        table.add_row(
            label,
            server.get("rule", server["kind"]),
            str(server.get("max_concurrent_workers", "")),
            f"{server['must_hold_mb']:.0f}" if hetps else "",
            f"{server['rss_at_start_mb']:.0f}",
            *(f"{after[phase]:.0f}" if phase in after else "" for phase in phases),
            f"{server['peak_rss_mb']:.0f}",
            f"{server['limit_mb']:.0f}" if hetps else "",
        )
    console.print(table)
    console.print(f"must hold = {memory.get('must_hold', MUST_HOLD)}; limit: {memory['rule']}")


def asgd_workers(settings: Settings) -> int:
    """Workers loading each ASGD server at once: the largest concurrency level (16 in a full run)."""
    return max(settings.concurrency)


def load_asgd(
    pool: WorkerPool, pool_target: PoolTarget, server: ServerProcess, seconds: float, console: Console
) -> dict[str, Any]:
    """``pool_target``'s workers pushing (and pulling) at once for ``seconds``, the server's RSS traced."""
    before = rejected_requests(server.ready.metrics_port)
    with console.status(f"{pool_target.model} server under load"), RssTrace(server.pid) as trace:
        reports = pool.burst(pool_target.key, pool_target.workers, seconds)
    return {
        "workers": pool_target.workers,
        "steps": sum(int(r["steps"]) for r in reports),
        "aggregate_steps_per_s": sum(r["steps"] / r["elapsed"] for r in reports),
        "errors": sum(int(r["errors"]) for r in reports),
        "first_error": next((r["error"] for r in reports if r["error"]), ""),
        # What a limit that refuses pushes cost: refusals the workers retried.
        "refused": refused_during(before, rejected_requests(server.ready.metrics_port)),
        "rss_trace": trace.summary(),
    }


def load_large(
    settings: Settings, fleet: Fleet, large_target: PoolTarget, server: ServerProcess, console: Console
) -> dict[str, Any]:
    """The large model's server loaded by its workers, ``pushers_per_process`` to a process (16 of
    its workers each in a process of its own would need 16 GB on the host)."""
    with console.status(f"starting {large_target.workers} workers of {large_target.model}"):
        pushers = WorkerPool(large_target.workers, [large_target], settings.pushers_per_process)
    try:
        fleet.checkpoint(f"{large_target.model} joined")
        load = load_asgd(pushers, large_target, server, settings.rss_seconds, console)
        fleet.checkpoint(f"{large_target.model} load")
    finally:
        pushers.close()
    return load


def print_loads(loads: dict[str, Any], console: Console) -> None:
    for model, load in loads.items():
        refused = ", ".join(f"{count} {reason}" for reason, count in load["refused"].items()) or "none"
        trace = load["rss_trace"]
        peak_at = f", RSS highest {trace['max_mb']:.0f} MB at {trace['max_at_s']:.1f} s" if trace["max_mb"] else ""
        console.print(
            f"{model}, {load['workers']} workers: {load['steps']} steps, {load['aggregate_steps_per_s']:.2f} steps/s, "
            f"{load['errors']} errors, refused {refused}{peak_at}"
        )


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument(
        "--server-config", type=Path, default=None, help="a `psserver serve --config` TOML file for every hetps server"
    )
    known, rest = extra.parse_known_args(argv)
    server_config = read_toml(known.server_config) if known.server_config is not None else {}
    settings, out = parse_settings("server_memory", __doc__, rest)
    console, log_dir = prepare_output(out)
    torch.set_num_threads(TORCH_THREADS)
    started = time.perf_counter()
    results = run_header(settings)
    results["server_config"] = server_config
    fleet = Fleet(log_dir)
    try:
        with console.status("starting servers"):
            jobs = [HetpsJob(f"hetps-{model}-1shard", model, "asgd", (), 0, 1) for model in settings.models]
            large = HetpsJob(f"hetps-{settings.large_model}-1shard", settings.large_model, "asgd", (), 0, 1)
            by_label = {
                j.label: fleet.start_hetps(j._replace(config=merged(j.config or {}, server_config)))
                for j in [*jobs, gap_aware_job(settings), large]
            }
            targets = [
                PoolTarget(job.model, job.model, (by_label[job.label].address,), asgd_workers(settings)) for job in jobs
            ]
            gap = by_label[gap_aware_job(settings).label]
            targets.append(PoolTarget("gap-aware", gap.model, (gap.address,), settings.rss_workers))
            large_target = PoolTarget("large", large.model, (by_label[large.label].address,), asgd_workers(settings))
            for pool_target in [*targets, large_target]:
                initialize_parameters(pool_target.model, list(pool_target.addresses))
        with console.status("starting worker processes"):
            pool = WorkerPool(max(asgd_workers(settings), settings.rss_workers), targets)
        fleet.checkpoint("workers joined")
        results["asgd_load"] = {}
        try:
            for job, pool_target in zip(jobs, targets[:-1], strict=True):
                load = load_asgd(pool, pool_target, by_label[job.label], settings.rss_seconds, console)
                results["asgd_load"][pool_target.model] = load
            results["gap_aware_load"] = load_gap_aware(settings, pool, console)
            fleet.checkpoint("load")
        finally:
            pool.close()
        results["asgd_load"][large.model] = load_large(settings, fleet, large_target, by_label[large.label], console)
        for server in fleet.servers:
            server.workers = settings.rss_workers if server.rule == "gap-aware" else asgd_workers(settings)
        results["memory"] = measure_memory(fleet)
    finally:
        fleet.stop()
    results["targets"] = memory_targets(results["memory"])
    results["wall_seconds"] = time.perf_counter() - started
    print_memory_table(results["memory"], console)
    print_loads(results["asgd_load"], console)
    print_targets(results["targets"], console)
    write_results("server_memory", argv, results, out, console)
    return results


if __name__ == "__main__":
    apply_allocator(WORKER)
    main()
