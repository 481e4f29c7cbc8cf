"""Whether hetps's step variants pay on this host: one worker's steps through plain hetps and each variant.

    python -m benchmarks.step_flags [--quick | --smoke] [--model resnet18] [--repeats N]
                                    [--variants streams] [--out benchmarks/results/step_flags.json]

``benchmarks.step_round_trip`` measures the variants among its 30-odd systems; this measures only
what decides them, so the same time buys more repeats: for one model, one worker steps through
plain hetps and each of ``HETPS_VARIANTS`` (``streams``: every PushPull as two streams), each on a
1-shard ASGD server of its own, and through the bare gRPC mover and that mover doing the step's
arithmetic (``arith``) for scale, at fp32, bf16, and 8-bit pushes with bf16 pulls. Systems step in
a fresh (seeded) order every round, as in ``step_round_trip``.

The verdict per variant and wire form compares the variant's step with plain hetps's, repeat by
repeat: ``faster`` when it was faster in every repeat, ``slower`` when slower in every one, else
``level`` (within this run's spread). The bare movers are checked against their own repeats; a
verdict in a run whose checks failed is marked so.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from benchmarks.harness.models import MODELS
from benchmarks.harness.processes import Fleet
from benchmarks.harness.report import prepare_output, print_validity, run_header, spread, write_results
from benchmarks.harness.settings import TORCH_THREADS, Settings
from benchmarks.harness.stats import verdict
from benchmarks.harness.step_systems import (
    HETPS_VARIANTS,
    INT8,
    SystemSpec,
    hetps_addresses,
    hetps_jobs,
    start_movers,
)
from benchmarks.harness.step_tables import print_step_tables
from benchmarks.harness.validity import repeat_spread_check, summarize_checks
from benchmarks.step_round_trip import measure_steps
from psserver.allocator import WORKER, apply_allocator

WIRE_FORMS = ("fp32", "bf16", "int8/bf16")
# The movers give each row its scale: the transport's ceiling, and that ceiling doing the arithmetic.
MOVERS = ("bare", "arith")


def row_name(kind: str, wire: str) -> str:
    """A system's name as ``step_round_trip`` gives it (``streams-1shard-bf16``)."""
    return f"{kind}-{INT8}" if wire == "int8/bf16" else f"{kind}-1shard-{wire}"


def flag_systems(variants: Sequence[str] = tuple(HETPS_VARIANTS)) -> list[SystemSpec]:
    kinds = ("hetps", *variants, *MOVERS)
    return [SystemSpec(row_name(kind, wire), kind, 1, wire) for kind in kinds for wire in WIRE_FORMS]


def flag_verdicts(
    steps: dict[str, Any], variants: Sequence[str] = tuple(HETPS_VARIANTS)
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per variant and wire form: its speed against plain hetps's (median, min, max over repeats)
    and the verdict; beside it, plain hetps's and the variant's speed against the bare mover."""
    verdicts: dict[str, dict[str, dict[str, Any]]] = {}
    for data in steps.values():
        ratios = data["speed_ratios"]
        for variant in variants:
            for wire in WIRE_FORMS:
                name, plain, bare = row_name(variant, wire), row_name("hetps", wire), row_name("bare", wire)
                against = ratios[f"{name} vs {plain}"]
                verdicts.setdefault(variant, {})[wire] = {
                    "vs hetps": {key: against[key] for key in ("median", "min", "max")},
                    "verdict": verdict(against),
                    "hetps vs bare": steps_ratio(data, plain, bare),
                    "variant vs bare": steps_ratio(data, name, bare),
                }
    return verdicts


def steps_ratio(data: dict[str, Any], first: str, other: str) -> float:
    """``other``'s median step time over ``first``'s (> 1: ``first`` is faster)."""
    systems = data["systems"]
    return float(systems[other]["step_ms"]["median"] / systems[first]["step_ms"]["median"])


def print_verdicts(verdicts: dict[str, dict[str, dict[str, Any]]], valid: bool, console: Console) -> None:
    table = Table(title="Each variant against plain hetps (speed, > 1: the variant is faster)")
    for column in ("variant", "wire", "median", "min–max", "verdict", "hetps vs bare", "variant vs bare"):
        table.add_column(column, justify="left" if column in ("variant", "wire", "verdict") else "right")
    for variant, rows in verdicts.items():
        for wire, row in rows.items():
            table.add_row(
                variant,
                wire,
                f"{row['vs hetps']['median']:.2f}",
                spread(row["vs hetps"], 2),
                row["verdict"] if valid else f"{row['verdict']} (baselines out of line)",
                f"{row['hetps vs bare']:.2f}",
                f"{row['variant vs bare']:.2f}",
            )
    console.print(table)


def parse(argv: Sequence[str] | None) -> tuple[Settings, Path, tuple[str, ...]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--smoke", action="store_true", help="a tiny model and a few steps (tests)")
    parser.add_argument("--model", choices=sorted(MODELS), default=None, help="default resnet18 (tiny with --smoke)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (default 9, 5 with --quick)")
    parser.add_argument(
        "--variants",
        default=",".join(HETPS_VARIANTS),
        help="the variants to step, comma-separated (default: all of them; fewer leave time for more repeats)",
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/step_flags.json"))
    args = parser.parse_args(argv)
    variants = tuple(name.strip() for name in args.variants.split(",") if name.strip())
    unknown = [name for name in variants if name not in HETPS_VARIANTS]
    if unknown or not variants:
        parser.error(f"--variants: {', '.join(unknown) or 'none given'}; choose from {', '.join(HETPS_VARIANTS)}")
    base = Settings.smoke() if args.smoke else Settings.quick() if args.quick else Settings()
    repeats = args.repeats if args.repeats is not None else 2 if args.smoke else 5 if args.quick else 9
    if repeats < 1:
        parser.error("--repeats must be at least 1")
    model = args.model or ("tiny" if args.smoke else "resnet18")
    return replace(base, models=(model,), repeats=repeats), args.out, variants


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    settings, out, variants = parse(argv)
    console, log_dir = prepare_output(out)
    torch.set_num_threads(TORCH_THREADS)
    started = time.perf_counter()
    results = run_header(settings)
    fleet = Fleet(log_dir)
    systems = flag_systems(variants)
    try:
        with console.status("starting servers"):
            hetps = hetps_addresses(
                settings, fleet.start_all(hetps_jobs(settings, two_shards=False, variants=variants))
            )
            movers = start_movers(fleet, systems)
        server_pids = {server.address: server.pid for server in fleet.servers}
        addresses = {group: [server.address for server in servers] for group, servers in movers.items()}
        results["steps"] = measure_steps(settings, hetps, addresses, server_pids, console, systems=systems)
    finally:
        fleet.stop()
    ((model, data),) = results["steps"].items()
    checks = [
        repeat_spread_check(f"{model}:{name}", system["repeat_medians_ms"])
        for name, system in data["systems"].items()
        if system["kind"] in MOVERS
    ]
    results["validity"] = summarize_checks(checks)
    results["verdicts"] = flag_verdicts(results["steps"], variants)
    results["wall_seconds"] = time.perf_counter() - started
    print_step_tables(results["steps"], console)
    print_validity(results["validity"], console)
    print_verdicts(results["verdicts"], results["validity"]["valid"], console)
    write_results("step_flags", argv, results, out, console)
    return results


if __name__ == "__main__":
    apply_allocator(WORKER)
    main()
