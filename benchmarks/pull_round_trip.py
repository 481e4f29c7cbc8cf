"""What reading a Pull on the caller's thread gains: a worker's Pull read by a thread of gRPC's, and by its own.

    python -m benchmarks.pull_round_trip [--quick | --smoke] [--model small | --parameters N] [--wire fp32]
                                         [--repeats N] [--pulls N] [--out benchmarks/results/pull_round_trip.json]

A worker pulls on its own (not in a PushPull) at start, after a reconnection, and on every
communication step of the rules whose worker reads the centre first (GEM, EASGD), as an observer
does for every snapshot. ``psworker.channels`` opens its channels with gRPC's
``SingleThreadedUnaryStream`` option, so the Pull's messages are read on the thread that iterates
them. Without it, gRPC's synchronous client starts a thread on an idle channel for each call to
read its events and hands every message over. Here one worker joins a 1-shard ASGD server and
pulls the shard the way ``PSClient.pull`` does (``psworker.transfer.receive_params``, then the
shard clock from the trailing metadata) through two channels to it, one with the option
(``single``) and one without (``threaded``), in a fresh seeded order every round. Each repeat
gives each form's median pull; the ratio per repeat is threaded / single (above 1: the single
thread is faster), and the verdict is ``faster`` or ``slower`` only when every repeat agrees.
The worker process's CPU per pull (every thread) is measured around each pull.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import torch
from rich.table import Table

from benchmarks.harness.models import MODELS
from benchmarks.harness.processes import Fleet, HetpsJob
from benchmarks.harness.report import prepare_output, write_results
from benchmarks.harness.settings import TORCH_THREADS
from benchmarks.harness.stats import summarize, verdict
from psproto.dtypes import WIRE_DTYPE_NAMES
from psproto.layout import Layout
from psproto.tuning import apply_malloc_tuning
from psproto.v1 import ps_pb2
from psworker import transfer
from psworker.channels import SINGLE_THREADED_PULLS, channel_options
from psworker.client import PSClient

FORMS = ("single", "threaded")
# Pulls per repeat: enough for a stable median at each size, within a minute or so on 2 cores.
PULLS = {"resnet18": 12, "small": 300, "tiny": 300}
PULL_TIMEOUT_S = 60.0


def form_options(form: str) -> list[tuple[str, int]]:
    """The worker's channel options, less the single-threaded reading for ``threaded``."""
    options = channel_options()
    return options if form == "single" else [option for option in options if option != SINGLE_THREADED_PULLS]


def pull_once(data: transfer.DataPath, request: ps_pb2.PullRequest, out: torch.Tensor) -> int:
    """One Pull as ``PSClient.pull`` makes it of one shard; returns the parameters' clock."""
    messages = data.pull(request, timeout=PULL_TIMEOUT_S)
    clock = transfer.receive_params(messages, out)
    transfer.shard_clock(messages)
    return clock


def measure(address: str, layout: Layout, wire: str, repeats: int, pulls: int, seed: int) -> dict[str, Any]:
    """Each form's per-repeat median pull (ms), client CPU per pull (ms), and threaded / single per repeat."""
    client = PSClient([address], layout, name=f"pulls-{wire}", wire_dtype=wire)
    channels = {form: grpc.insecure_channel(address, options=form_options(form)) for form in FORMS}
    try:
        if not client.initialized:
            client.init(torch.zeros(layout.total_length))
        request = ps_pb2.PullRequest(worker_id=client.sessions[0].worker_id, wire_dtype=WIRE_DTYPE_NAMES[wire])
        paths = {form: transfer.DataPath(channel) for form, channel in channels.items()}
        out = torch.empty(layout.total_length)
        for form in FORMS:  # connected and warm before anything is timed
            for _ in range(3):
                pull_once(paths[form], request, out)
        order = random.Random(seed)
        medians: dict[str, list[float]] = {form: [] for form in FORMS}
        cpu: dict[str, float] = dict.fromkeys(FORMS, 0.0)
        for _ in range(repeats):
            times: dict[str, list[float]] = {form: [] for form in FORMS}
            for _ in range(pulls):
                for form in order.sample(FORMS, len(FORMS)):
                    wall, used = time.perf_counter(), time.process_time()
                    pull_once(paths[form], request, out)
                    times[form].append(time.perf_counter() - wall)
                    cpu[form] += time.process_time() - used
            for form in FORMS:
                medians[form].append(statistics.median(times[form]) * 1e3)
        ratios = [threaded / single for single, threaded in zip(medians["single"], medians["threaded"], strict=True)]
        ratio = summarize(ratios)
        return {
            "median_ms": {form: summarize(medians[form]) for form in FORMS},
            "repeat_medians_ms": medians,
            "client_cpu_ms_per_pull": {form: cpu[form] * 1e3 / (repeats * pulls) for form in FORMS},
            "threaded_over_single": ratio,
            "verdict": verdict(ratio),
        }
    finally:
        for channel in channels.values():
            channel.close()
        client.close()


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--smoke", action="store_true", help="a tiny model and a few pulls (tests)")
    parser.add_argument("--model", choices=sorted(MODELS), default=None, help="default small (tiny with --smoke)")
    parser.add_argument(
        "--parameters", type=int, default=None, help="instead of --model, one flat tensor of this many parameters"
    )
    parser.add_argument("--wire", default="fp32,bf16", help="pull dtypes, comma-separated (default fp32,bf16)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (default 7, 3 with --quick)")
    parser.add_argument("--pulls", type=int, default=None, help="pulls of each form per repeat")
    parser.add_argument("--seed", type=int, default=0, help="seeds the order the forms pull in")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/pull_round_trip.json"))
    args = parser.parse_args(argv)
    args.model = args.model or ("tiny" if args.smoke else "small")
    args.repeats = args.repeats if args.repeats is not None else 2 if args.smoke else 3 if args.quick else 7
    if args.parameters is not None and args.parameters < 1:
        parser.error("--parameters must be at least 1")
    # As many bytes a repeat as the small model's pulls, at least a dozen pulls.
    sized = max(12, PULLS["small"] * 101_770 // args.parameters) if args.parameters is not None else None
    args.pulls = args.pulls if args.pulls is not None else 5 if args.smoke else sized or PULLS[args.model]
    args.wires = [wire.strip() for wire in args.wire.split(",") if wire.strip()]
    bad = [wire for wire in args.wires if wire not in WIRE_DTYPE_NAMES]
    if bad or not args.wires:
        parser.error(f"--wire: {', '.join(bad) or 'none given'}; choose from {', '.join(WIRE_DTYPE_NAMES)}")
    if args.repeats < 1 or args.pulls < 1:
        parser.error("--repeats and --pulls must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    console, log_dir = prepare_output(args.out)
    torch.set_num_threads(TORCH_THREADS)
    started = time.perf_counter()
    shapes = MODELS[args.model]() if args.parameters is None else [("flat", (args.parameters,))]
    model = args.model if args.parameters is None else f"flat-{args.parameters}"
    layout = Layout.from_named_shapes(shapes)
    results: dict[str, Any] = {
        "model": model,
        "parameters": layout.total_length,
        "repeats": args.repeats,
        "pulls_per_repeat": args.pulls,
        "wires": {},
    }
    fleet = Fleet(log_dir)
    try:
        with console.status("starting the server"):
            server = fleet.start_all([HetpsJob(f"pulls-{model}", model, "asgd", (), 0, 1)])
        address = next(iter(server.values())).address
        for wire in args.wires:
            with console.status(f"pulling {wire}"):
                results["wires"][wire] = measure(address, layout, wire, args.repeats, args.pulls, args.seed)
    finally:
        fleet.stop()
    results["wall_seconds"] = time.perf_counter() - started
    table = Table(title=f"A worker's Pull, {model} ({layout.total_length:,} parameters), ms")
    for column in ("pull dtype", "single thread", "threaded", "threaded / single (min–max)", "verdict", "client CPU"):
        table.add_column(column, justify="left" if column in ("pull dtype", "verdict") else "right")
    for wire, row in results["wires"].items():
        ratio, cpu = row["threaded_over_single"], row["client_cpu_ms_per_pull"]
        table.add_row(
            wire,
            f"{row['median_ms']['single']['median']:.3f}",
            f"{row['median_ms']['threaded']['median']:.3f}",
            f"{ratio['median']:.2f} ({ratio['min']:.2f}–{ratio['max']:.2f})",
            row["verdict"],
            f"{cpu['single']:.3f} / {cpu['threaded']:.3f}",
        )
    console.print(table)
    write_results("pull_round_trip", argv, results, args.out, console)
    return results


if __name__ == "__main__":
    apply_malloc_tuning()
    main()
