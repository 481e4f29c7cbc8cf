"""What the lighter form of a worker's Pull and Push gains: each call made both ways, in turn, against one server.

    python -m benchmarks.call_forms [--quick | --smoke] [--model small | --parameters N] [--calls pull,push]
                                    [--wire fp32,bf16] [--repeats N] [--calls-per-repeat N]
                                    [--out benchmarks/results/call_forms.json]

A worker pulls on its own (not in a PushPull) at start, after a reconnection, and on every
communication step of the rules whose worker reads the centre before it pushes (GEM, EASGD), as
an observer does for every snapshot; those rules then push without the parameters back. gRPC
Python's synchronous client handles a streaming call on threads of its own, started per call on an
idle channel. So the worker reads a Pull on the thread that iterates it (gRPC's
``SingleThreadedUnaryStream`` channel option, ``psworker.channels``; for shards of at most 8 MiB in
fp32), and sends a Push of one chunk as one unary PushUnary call (``psworker.transfer.push``).
Here one worker joins a 1-shard ASGD server, and each call is made both ways as the worker makes
it of one shard, in a fresh seeded order every round:

- ``pull``: ``single`` (the worker's channel) against ``threaded`` (the same channel options less
  that one), read as ``PSClient.pull`` reads a shard (``transfer.receive_params``, then the shard
  clock from the trailing metadata);
- ``push``: ``one-message`` (PushUnary) against ``stream`` (Push), through ``transfer.push``, fp32
  or bf16 chunks of the worker's chunk size (the one-message form needs the push to be one chunk:
  with a larger shard both rows are streams, an A/A check, which the row's ``one_message`` and the
  table say).

Each repeat gives each form's median call; the ratio per repeat is the other form's time over the
lighter form's (above 1: the lighter form is faster), and the verdict is ``faster`` or ``slower``
only when every repeat agrees. The worker process's CPU per call (every thread) is measured
around each call.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import torch
from rich.table import Table

from benchmarks.harness.models import MODELS
from benchmarks.harness.processes import Fleet, HetpsJob
from benchmarks.harness.report import prepare_output, write_results
from benchmarks.harness.settings import TORCH_THREADS
from benchmarks.harness.stats import speed_ratio, summarize, verdict
from psproto import codec
from psproto.dtypes import WIRE_DTYPE_NAMES
from psproto.layout import Layout
from psproto.v1 import ps_pb2
from psserver.allocator import WORKER, apply_allocator
from psworker import transfer
from psworker.channels import channel_options
from psworker.client import ClientConfig, PSClient

# Per call: the lighter form (what the worker does), then the form it is compared with.
FORMS = {"pull": ("single", "threaded"), "push": ("one-message", "stream")}
# Calls of each form per repeat: enough for a stable median at each size, within a minute or so on 2 cores.
CALLS = {"resnet18": 12, "small": 300, "tiny": 300}
SMALL_PARAMETERS = 101_770
CALL_TIMEOUT_S = 60.0


def form_options(form: str) -> list[tuple[str, int]]:
    """The worker's channel options, with pulls read on the caller's thread but for the ``threaded`` pull."""
    return channel_options(single_threaded_pulls=form != "threaded")


def pull_once(data: transfer.DataPath, request: ps_pb2.PullRequest, out: torch.Tensor) -> int:
    """One Pull as ``PSClient.pull`` makes it of one shard; returns the parameters' clock."""
    messages = data.pull(request, timeout=CALL_TIMEOUT_S)
    clock = transfer.receive_params(messages, out)
    transfer.shard_clock(messages)
    return clock


def _calls(
    call: str, client: PSClient, address: str, wire: str
) -> tuple[dict[str, Callable[[], object]], list[Any], bool]:
    """One call of each form of ``call`` (a closure each), the channels they use (to close), and
    whether the lighter form is what it says (a push of more than a chunk is a stream both ways)."""
    length, worker_id, dtype = client.layout.total_length, client.sessions[0].worker_id, WIRE_DTYPE_NAMES[wire]
    lighter, other = FORMS[call]
    if call == "pull":
        channels = {form: grpc.insecure_channel(address, options=form_options(form)) for form in (lighter, other)}
        request = ps_pb2.PullRequest(worker_id=worker_id, wire_dtype=dtype)
        out = torch.empty(length)
        paths = {form: transfer.DataPath(channel) for form, channel in channels.items()}
        return (
            {form: partial(pull_once, path, request, out) for form, path in paths.items()},
            [*channels.values()],
            True,
        )
    channel = grpc.insecure_channel(address, options=form_options("single"))
    data, update = transfer.DataPath(channel), torch.full((length,), 1e-6)
    push_ids = itertools.count(time.time_ns() // 1000)
    (one_call,), _ = transfer.unary_forms([length], dtype, dtype, codec.DEFAULT_CHUNK_BYTES)

    def push(unary: bool) -> ps_pb2.PushResponse:
        header = ps_pb2.PushHeader(
            worker_id=worker_id, push_id=next(push_ids), layout_hash=client.layout.hash, pull_dtype=dtype,
            kind=ps_pb2.PAYLOAD_KIND_GRADIENT, base_clock=client.clock,
        )  # fmt: skip
        chunks = codec.payloads(update, dtype)
        return transfer.push(data, header, chunks, CALL_TIMEOUT_S, (), [unary and one_call], 0)

    return {lighter: lambda: push(True), other: lambda: push(False)}, [channel], one_call


def measure(
    call: str, address: str, layout: Layout, wire: str, repeats: int, per_repeat: int, seed: int
) -> dict[str, Any]:
    """Each form's per-repeat median call (ms), the worker's CPU per call (ms), and the other form's
    time over the lighter form's, per repeat and of the fastest calls (``stats.speed_ratio``)."""
    client = PSClient([address], layout, name=f"{call}-{wire}", config=ClientConfig(wire_dtype=wire))
    channels: list[Any] = []
    try:
        if not client.initialized:
            client.init(torch.zeros(layout.total_length))
        client.pull(torch.empty(layout.total_length))
        forms, channels, one_message = _calls(call, client, address, wire)
        names = FORMS[call]
        for form in names:  # connected and warm before anything is timed
            for _ in range(3):
                forms[form]()
        order = random.Random(seed)
        medians: dict[str, list[float]] = {form: [] for form in names}
        samples: dict[str, list[float]] = {form: [] for form in names}
        cpu = dict.fromkeys(names, 0.0)
        for _ in range(repeats):
            times: dict[str, list[float]] = {form: [] for form in names}
            for _ in range(per_repeat):
                for form in order.sample(names, len(names)):
                    wall, used = time.perf_counter(), time.process_time()
                    forms[form]()
                    times[form].append(time.perf_counter() - wall)
                    cpu[form] += time.process_time() - used
            for form in names:
                medians[form].append(statistics.median(times[form]) * 1e3)
                samples[form] += times[form]
        lighter, other = names
        ratio = speed_ratio(medians[lighter], medians[other], samples[lighter], samples[other])
        return {
            "one_message": one_message,
            "median_ms": {form: summarize(medians[form]) for form in names},
            "repeat_medians_ms": medians,
            "client_cpu_ms_per_call": {form: cpu[form] * 1e3 / (repeats * per_repeat) for form in names},
            "other_over_lighter": ratio,
            "verdict": verdict(ratio),
        }
    finally:
        for channel in channels:
            channel.close()
        client.close()


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--smoke", action="store_true", help="a tiny model and a few calls (tests)")
    parser.add_argument("--model", choices=sorted(MODELS), default=None, help="default small (tiny with --smoke)")
    parser.add_argument(
        "--parameters", type=int, default=None, help="instead of --model, one flat tensor of this many parameters"
    )
    parser.add_argument("--calls", default="pull,push", help="the calls to time, comma-separated (default pull,push)")
    parser.add_argument("--wire", default="fp32,bf16", help="wire dtypes, comma-separated (default fp32,bf16)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (default 7, 3 with --quick)")
    parser.add_argument("--calls-per-repeat", type=int, default=None, help="calls of each form per repeat")
    parser.add_argument("--seed", type=int, default=0, help="seeds the order the forms are called in")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/call_forms.json"))
    args = parser.parse_args(argv)

    def listed(option: str, text: str, known: Sequence[str]) -> list[str]:
        names = [name.strip() for name in text.split(",") if name.strip()]
        unknown = [name for name in names if name not in known]
        if unknown or not names:
            parser.error(f"{option}: {', '.join(unknown) or 'none given'}; choose from {', '.join(known)}")
        return names

    args.calls, args.wires = (
        listed("--calls", args.calls, list(FORMS)),
        listed("--wire", args.wire, list(WIRE_DTYPE_NAMES)),
    )
    args.model = args.model or ("tiny" if args.smoke else "small")
    args.repeats = args.repeats if args.repeats is not None else 2 if args.smoke else 3 if args.quick else 7
    if args.parameters is not None and args.parameters < 1:
        parser.error("--parameters must be at least 1")
    # As many bytes a repeat as the small model's calls, and at least a dozen calls.
    sized = max(12, CALLS["small"] * SMALL_PARAMETERS // args.parameters) if args.parameters is not None else None
    default_calls = 5 if args.smoke else sized or CALLS[args.model]
    args.per_repeat = args.calls_per_repeat if args.calls_per_repeat is not None else default_calls
    if args.repeats < 1 or args.per_repeat < 1:
        parser.error("--repeats and --calls-per-repeat must be at least 1")
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
        "calls_per_repeat": args.per_repeat,
        "calls": {},
    }
    fleet = Fleet(log_dir)
    try:
        with console.status("starting the server"):
            server = fleet.start_all([HetpsJob(f"calls-{model}", model, "asgd", (), 0, 1)])
        address = next(iter(server.values())).address
        for call in args.calls:
            for wire in args.wires:
                with console.status(f"{call} {wire}"):
                    row = measure(call, address, layout, wire, args.repeats, args.per_repeat, args.seed)
                results["calls"].setdefault(call, {})[wire] = row
    finally:
        fleet.stop()
    results["wall_seconds"] = time.perf_counter() - started
    table = Table(title=f"A worker's calls, {model} ({layout.total_length:,} parameters), ms")
    columns = ("call", "wire", "lighter form", "other form", "other / lighter (min–max)", "verdict", "worker CPU")
    for column in columns:
        table.add_column(column, justify="left" if column in ("call", "wire", "verdict") else "right")
    for call, rows in results["calls"].items():
        lighter, other = FORMS[call]
        for wire, row in rows.items():
            ratio, cpu, ms = row["other_over_lighter"], row["client_cpu_ms_per_call"], row["median_ms"]
            table.add_row(
                call,
                wire,
                f"{lighter if row['one_message'] else 'stream (A/A)'} {ms[lighter]['median']:.3f}",
                f"{other} {ms[other]['median']:.3f}",
                f"{ratio['median']:.2f} ({ratio['min']:.2f}–{ratio['max']:.2f})",
                row["verdict"],
                f"{cpu[lighter]:.3f} / {cpu[other]:.3f}",
            )
    console.print(table)
    write_results("call_forms", argv, results, args.out, console)
    return results


if __name__ == "__main__":
    apply_allocator(WORKER)
    main()
