"""A worker step at several chunk sizes: hetps and the bare gRPC mover, interleaved step by step.

    python -m benchmarks.chunk_size [--quick | --smoke] [--sizes 512KiB,1MiB,2MiB,4MiB] [--model resnet18]
                                    [--wire fp32] [--out benchmarks/results/chunk_size.json]

What a step's tensors are cut into (``--chunk-size`` of ``psserver serve`` and the workers) sets
how many messages a step is and how large each copy between the socket and a tensor is. For each
size one ASGD shard runs with that ``--chunk-size`` and one worker pushes and pulls in chunks of
the same size; the bare mover (one server, a key per size) moves the same bytes with the same
chunking. Every system steps once per round, in turn, so a busy machine slows them alike; the
table gives each system's median step and its speed against the same system at the default
size (``psproto.codec.DEFAULT_CHUNK_BYTES``; above 1: faster), round by round.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import torch
from rich.table import Table

from benchmarks.harness.models import MODELS
from benchmarks.harness.processes import Fleet, HetpsJob
from benchmarks.harness.report import prepare_output, run_header, run_size, write_results
from benchmarks.harness.settings import TORCH_THREADS
from benchmarks.harness.stats import summarize
from benchmarks.harness.steps import BareStep, HetpsStep, StepSystem, seeded_parameters, warm_up
from pscli.config_file import parse_byte_size
from psproto import codec
from psproto.layout import Layout

WIRES = ("fp32", "bf16", "fp16")  # what both systems send


def parse_sizes(text: str) -> list[int]:
    """``512KiB,1MiB,...`` in bytes; a ValueError says which one is wrong and why."""
    sizes = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        size = parse_byte_size(item)
        if size is None:
            raise ValueError(f"{item!r} is not a number of bytes, KiB or MiB (e.g. 1MiB)")
        problem = codec.chunk_bytes_problem(size, codec.DEFAULT_MAX_MESSAGE_BYTES)
        if problem is not None:
            raise ValueError(problem)
        sizes.append(size)
    if not sizes:
        raise ValueError("give at least one size")
    return sorted(set(sizes))


def label(family: str, size: int) -> str:
    return f"{family}-{size // 1024}KiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--smoke", action="store_true", help="a tiny model and a few rounds (tests)")
    parser.add_argument("--sizes", default="512KiB,1MiB,2MiB,4MiB", help="chunk sizes, comma-separated")
    parser.add_argument("--model", default=None, choices=sorted(MODELS), help="default resnet18 (tiny with --smoke)")
    parser.add_argument("--wire", default="fp32", choices=WIRES)
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (default 60, 20 quick)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/chunk_size.json"))
    args = parser.parse_args(argv)
    try:
        sizes = parse_sizes(args.sizes)
    except ValueError as error:
        parser.error(f"--sizes: {error}")
    rounds, model = run_size(parser, args, args.rounds, "--rounds")
    started = time.perf_counter()
    torch.set_num_threads(TORCH_THREADS)
    console, log_dir = prepare_output(args.out)
    layout = Layout.from_named_shapes(MODELS[model](), 1)
    flat = seeded_parameters(layout.total_length)
    update = torch.randn(layout.total_length, generator=torch.Generator().manual_seed(1)) * 1e-3
    out = torch.empty_like(flat)
    fleet = Fleet(log_dir)
    systems: dict[str, StepSystem] = {}
    try:
        bare = fleet.start_helper("bare-grpc", "bare", "benchmarks.harness.bare_grpc")
        for size in sizes:
            name = label("hetps", size)
            server = fleet.start_hetps(HetpsJob(name, model, "asgd", (), 0, 1, config={"shard": {"chunk_bytes": size}}))
            systems[name] = HetpsStep([server.address], layout, name, args.wire, flat, size)
            systems[label("bare", size)] = BareStep([bare.address], layout, label("bare", size), args.wire, flat, size)
        for system in systems.values():
            warm_up(system, update, out, 1 if args.smoke else 3, lambda: 0.0)
        samples: dict[str, list[float]] = {name: [] for name in systems}
        for _ in range(rounds):
            for name, system in systems.items():
                began = time.perf_counter()
                system.step(update, out)
                samples[name].append(time.perf_counter() - began)
    finally:
        for system in systems.values():
            system.close()
        fleet.stop()
    results: dict[str, Any] = {
        **run_header(None),
        "model": model,
        "parameters": layout.total_length,
        "wire": args.wire,
        "sizes": sizes,
        "rounds": rounds,
        "systems": {name: summarize([s * 1e3 for s in taken]) for name, taken in samples.items()},
        "speed_vs_default": speed_vs_default(samples, sizes),
    }
    print_table(results, console)
    results["wall_seconds"] = time.perf_counter() - started
    write_results("chunk_size", argv, results, args.out, console)
    return 0


def speed_vs_default(samples: dict[str, list[float]], sizes: list[int]) -> dict[str, dict[str, float]]:
    """Each system's speed against its family at the default size, round by round (its time over
    this one's), summarised; empty when the default size was not run."""
    if codec.DEFAULT_CHUNK_BYTES not in sizes:
        return {}
    ratios = {}
    for family in ("hetps", "bare"):
        reference = samples[label(family, codec.DEFAULT_CHUNK_BYTES)]
        for size in sizes:
            taken = samples[label(family, size)]
            ratios[label(family, size)] = summarize([ref / own for ref, own in zip(reference, taken, strict=True)])
    return ratios


def print_table(results: dict[str, Any], console: Any) -> None:
    default = codec.DEFAULT_CHUNK_BYTES // 1024
    table = Table(
        title=f"Worker step by chunk size, {results['model']} ({results['parameters']:,} parameters), "
        f"{results['wire']}, {results['rounds']} rounds"
    )
    for column in ("system", "median ms", "IQR ms", f"speed vs {default}KiB (median, IQR)"):
        table.add_column(column, justify="left" if column == "system" else "right")
    for name, summary in results["systems"].items():
        ratio = results["speed_vs_default"].get(name)
        ratio_text = f"{ratio['median']:.2f} ({ratio['q1']:.2f}–{ratio['q3']:.2f})" if ratio else "—"
        table.add_row(name, f"{summary['median']:.1f}", f"{summary['q1']:.1f}–{summary['q3']:.1f}", ratio_text)
    console.print(table)


if __name__ == "__main__":
    sys.exit(main())
