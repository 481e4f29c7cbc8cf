"""Where a worker step's CPU goes: hetps and the bare gRPC mover, servers and clients, under a profiler.

    python -m benchmarks.step_profile [--quick | --smoke] [--model resnet18] [--wire fp32] [--steps N]
                                      [--against bare|arith] [--out benchmarks/results/step_profile.json]

``benchmarks.step_round_trip`` times hetps against the transport's ceiling (the bare mover, the
same chunking, one copy each way); this says where hetps's extra time goes. One ASGD shard and
one bare mover run under ``benchmarks.harness.profiled`` (yappi, CPU clock, builtins counted);
this process steps each of them ``--steps`` times as one worker under yappi too, after the same
warm-up as the timed benchmarks, and first as many steps unprofiled, for each side's CPU per
step in its Python threads and in gRPC's C-core threads (``/proc``), which the profile's groups
are read against. Every function's own CPU time is put in one group (the gRPC Python layer,
whose calls into gRPC's C core do the socket writes and the copies into the transport; thread
hand-offs; the 8-bit codec; buffer copies and dtype conversions; the finiteness sum; tensor
math, which on a server is the rule's apply; the bare mover's code; hetps's own Python), and the
CPU of the gRPC C-core threads that yappi cannot see (event engine: polling, socket reads) comes
from ``/proc``. The tables give CPU milliseconds per step for each process, and hetps minus bare.
With 8-bit pushes (``--wire int8/bf16``) hetps is profiled alone: the bare mover has no codec.
``--against arith`` profiles the bare mover doing an SGD step's arithmetic instead (the floor of
``step_round_trip``'s ``arith`` rows, 8-bit pushes included): hetps minus it is hetps's own work.

Profiling slows every process, so the step times printed are not speeds (``step_round_trip``
measures those); the shares are what this is for. A deterministic profiler adds about a
microsecond to every call it counts, so groups made of many small calls (hetps's Python code,
the libraries) come out larger than they are: read them against the unprofiled rows, which
bound what the Python threads really spent. Groups of a few large calls (copies, the rule's
math, the gRPC layer's calls into C) are what the CPU really spent.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import signal
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from benchmarks.harness.models import MODELS
from benchmarks.harness.processes import REPO_ROOT, Fleet, HetpsJob, ServerProcess, cpu_seconds
from benchmarks.harness.profiled import thread_cpu_seconds
from benchmarks.harness.report import prepare_output, run_header, run_size, write_results
from benchmarks.harness.settings import TORCH_THREADS
from benchmarks.harness.steps import BareStep, HetpsStep, StepSystem, seeded_parameters, warm_up, wire_problem
from psproto.layout import Layout

AGAINST = ("bare", "arith")  # what hetps is profiled beside: the plain mover, or the mover doing the arithmetic
WIRES = ("fp32", "bf16", "fp16")  # what both systems send; the bare mover has no 8-bit codec
PROFILE_WAIT_S = 60.0

# Groups of a function's own CPU time, first match wins.
GROUPS: tuple[tuple[str, Callable[[str, str], bool]], ...] = (
    ("gRPC Python layer (+ its C calls)", lambda module, name: "/grpc/" in module),
    ("thread hand-offs", lambda module, name: module.endswith(("threading.py", "queue.py", "thread.py"))),
    ("8-bit codec", lambda module, name: module.endswith(("_block_kernel.py", "blocks.py")) or "numba" in module),
    (
        "buffer copies and dtype conversions",
        lambda module, name: re.search(r"'(copy_|join|tobytes|to)'|^bytes$", name) is not None,
    ),
    ("finiteness sum", lambda module, name: "'sum'" in name),
    (
        "tensor math",
        lambda module, name: re.search(r"'(add_|mul_|sub_|addcmul_|lerp_|div_|neg_|mul|add)'", name) is not None,
    ),
    ("bare mover's code (its copies included)", lambda module, name: module.endswith("bare_grpc.py")),
    ("hetps Python code", lambda module, name: module.startswith(str(REPO_ROOT))),
)
OTHER = "other Python (libraries, interpreter)"
C_THREADS = "gRPC C-core threads (event engine)"


def group_of(module: str, name: str) -> str:
    for group, matches in GROUPS:
        if matches(module, name):
            return group
    return OTHER


def grouped(functions: list[dict[str, Any]], steps: int) -> dict[str, float]:
    """Milliseconds of own CPU per step in each group (every function counted once)."""
    totals: dict[str, float] = defaultdict(float)
    for function in functions:
        totals[group_of(function["module"], function["name"])] += function["own_s"] * 1e3 / steps
    return dict(totals)


def c_thread_ms(before: Mapping[str, float], after: Mapping[str, float], steps: int) -> float:
    """CPU milliseconds per step of the threads that run no Python (named other than the interpreter)."""
    return sum(
        (seconds - before.get(thread, 0.0)) * 1e3 / steps
        for thread, seconds in after.items()
        if not python_thread(thread)
    )


def top_functions(functions: list[dict[str, Any]], steps: int, count: int) -> list[dict[str, Any]]:
    ranked = sorted(functions, key=lambda f: f["own_s"], reverse=True)[:count]
    return [
        {
            "function": f"{Path(f['module']).name}:{f['line']} {f['name']}",
            "group": group_of(f["module"], f["name"]),
            "own_ms_per_step": f["own_s"] * 1e3 / steps,
            "calls_per_step": f["calls"] / steps,
        }
        for f in ranked
    ]


def _signal_and_wait(server: ServerProcess, signal_number: int, marker: Path) -> None:
    """Send ``signal_number`` to ``server`` and wait until it wrote ``marker``."""
    marker.unlink(missing_ok=True)
    os.kill(server.pid, signal_number)
    deadline = time.monotonic() + PROFILE_WAIT_S
    while not marker.exists():
        if time.monotonic() > deadline or server.process.poll() is not None:
            raise RuntimeError(f"{server.label} did not answer signal {signal_number} (no {marker})")
        time.sleep(0.05)


def python_thread(name: str) -> bool:
    """Whether an OS thread (``NAME/TID`` from /proc) runs Python: the interpreter's threads keep its name."""
    return name.startswith(("python", "pt_main_thread"))


def _unprofiled(
    system: StepSystem, server: ServerProcess, update: torch.Tensor, out: torch.Tensor, steps: int
) -> dict[str, float]:
    """``steps`` steps with no profiler running: the step's wall time and each side's CPU per step,
    split between gRPC's C-core threads and the rest, the Python threads (from /proc)."""
    pids = {"server": server.pid, "client": os.getpid()}
    threads_before = {side: thread_cpu_seconds(pid) for side, pid in pids.items()}
    process_before = {side: cpu_seconds(pid) for side, pid in pids.items()}
    samples = []
    for _ in range(steps):
        started = time.perf_counter()
        system.step(update, out)
        samples.append(time.perf_counter() - started)
    measured = {"step_ms": statistics.median(samples) * 1e3}
    for side, pid in pids.items():
        # gRPC's C-core threads live as long as the process; its Python layer starts threads per
        # call on the client, which end between two readings, so Python's share is the rest.
        c_threads = c_thread_ms(threads_before[side], thread_cpu_seconds(pid), steps)
        measured[f"{side}_c_threads_ms"] = c_threads
        measured[f"{side}_python_threads_ms"] = (cpu_seconds(pid) - process_before[side]) * 1e3 / steps - c_threads
    return measured


def profile_system(
    name: str, system: StepSystem, server: ServerProcess, path: Path, steps: int, warmup: int, length: int
) -> dict[str, Any]:
    """Warm ``system`` up, then profile ``steps`` steps of it on both sides."""
    import yappi

    update = torch.randn(length) * 1e-3
    out = torch.empty(length)
    warm_up(system, update, out, warmup, lambda: 0.0)
    unprofiled = _unprofiled(system, server, update, out, steps)
    _signal_and_wait(server, signal.SIGUSR2, path.with_suffix(path.suffix + ".started"))
    client_before = thread_cpu_seconds(os.getpid())
    yappi.clear_stats()
    yappi.set_clock_type("cpu")
    yappi.start(builtins=True)
    samples = []
    for _ in range(steps):
        started = time.perf_counter()
        system.step(update, out)
        samples.append(time.perf_counter() - started)
    yappi.stop()
    client_functions = [
        {"module": s.module, "name": s.name, "line": s.lineno, "calls": s.ncall, "own_s": s.tsub, "total_s": s.ttot}
        for s in yappi.get_func_stats()
    ]
    client_after = thread_cpu_seconds(os.getpid())
    _signal_and_wait(server, signal.SIGUSR1, path.with_suffix(path.suffix + ".done"))
    profile = json.loads(path.read_text())
    return {
        "system": name,
        "steps": steps,
        "unprofiled": unprofiled,
        "step_ms_under_profiler": statistics.median(samples) * 1e3,
        "server": _side(profile["functions"], profile["os_threads_at_start"], profile["os_threads"], steps),
        "client": _side(client_functions, client_before, client_after, steps),
    }


def _side(
    functions: list[dict[str, Any]], threads_before: Mapping[str, float], threads_after: Mapping[str, float], steps: int
) -> dict[str, Any]:
    groups = grouped(functions, steps)
    groups[C_THREADS] = c_thread_ms(threads_before, threads_after, steps)
    return {"groups_ms_per_step": groups, "top": top_functions(functions, steps, 25)}


def _cells(values: list[float | None]) -> list[str]:
    """hetps server, the other server, their difference, hetps client, the other client; "—" where the
    other system did not run."""
    hetps_server, other_server, hetps_client, other_client = values
    difference = None if hetps_server is None or other_server is None else hetps_server - other_server
    text = ["—" if value is None else f"{value:.1f}" for value in (hetps_server, other_server, difference)]
    if difference is not None:
        text[2] = f"{difference:+.1f}"
    return text + ["—" if value is None else f"{value:.1f}" for value in (hetps_client, other_client)]


def _both(
    hetps: dict[str, Any], other: dict[str, Any] | None, read: Callable[[dict[str, Any], str], float]
) -> list[float | None]:
    """``read(system, side)`` for hetps's server, the other server, hetps's client, the other client."""
    return [
        read(system, side) if system is not None else None for side in ("server", "client") for system in (hetps, other)
    ]


def print_tables(results: dict[str, Any], console: Console) -> None:
    hetps = results["systems"]["hetps"]
    other = next((name for name in AGAINST if name in results["systems"]), AGAINST[0])
    against = results["systems"].get(other)
    table = Table(
        title=f"CPU ms per step, {results['model']} ({results['parameters']:,} parameters), {results['wire']}"
    )
    for column in (
        "where",
        "hetps server",
        f"{other} server",
        f"server: hetps − {other}",
        "hetps client",
        f"{other} client",
    ):
        table.add_column(column, justify="left" if column == "where" else "right")
    for group in [name for name, _ in GROUPS] + [OTHER, C_THREADS]:
        read = functools.partial(_group_ms, group)
        table.add_row(group, *_cells(_both(hetps, against, read)))
    totals = _both(hetps, against, lambda system, side: sum(system[side]["groups_ms_per_step"].values()))
    table.add_row("all", *_cells(totals), style="bold")
    for label, key in (
        ("unprofiled: Python threads", "python_threads_ms"),
        ("unprofiled: C-core threads", "c_threads_ms"),
    ):
        table.add_row(label, *_cells(_both(hetps, against, functools.partial(_unprofiled_ms, key))))
    for label, field in (
        ("step, wall ms (unprofiled)", None),
        ("step, wall ms (under the profiler)", "step_ms_under_profiler"),
    ):
        steps = [
            None if system is None else system["unprofiled"]["step_ms"] if field is None else system[field]
            for system in (hetps, against)
        ]
        table.add_row(label, *["—" if value is None else f"{value:.1f}" for value in steps], "", "", "")
    console.print(table)
    top = Table(title="hetps server: the functions with the most own CPU")
    for column in ("function", "group", "ms/step", "calls/step"):
        top.add_column(column, justify="left" if column in ("function", "group") else "right")
    for row in hetps["server"]["top"][:15]:
        top.add_row(row["function"][:90], row["group"], f"{row['own_ms_per_step']:.2f}", f"{row['calls_per_step']:.1f}")
    console.print(top)


def _group_ms(group: str, system: dict[str, Any], side: str) -> float:
    return float(system[side]["groups_ms_per_step"].get(group, 0.0))


def _unprofiled_ms(key: str, system: dict[str, Any], side: str) -> float:
    return float(system["unprofiled"][f"{side}_{key}"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps")
    parser.add_argument("--smoke", action="store_true", help="a tiny model and a few steps (tests)")
    parser.add_argument("--model", default=None, choices=sorted(MODELS), help="default resnet18 (tiny with --smoke)")
    parser.add_argument(
        "--wire",
        default="fp32",
        help=f"{', '.join(WIRES)} for both systems, or PUSH/PULL such as int8/bf16 (hetps alone)",
    )
    parser.add_argument("--steps", type=int, default=None, help="profiled steps of each system (default 60, 20 quick)")
    parser.add_argument(
        "--against", default="bare", choices=AGAINST, help="the bare mover (default), or the mover doing the arithmetic"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/step_profile.json"))
    args = parser.parse_args(argv)
    problem = wire_problem(args.wire)
    if problem is not None:
        parser.error(f"--wire {args.wire}: {problem}")
    # The plain bare mover has no 8-bit codec: with 8-bit pushes and --against bare hetps is profiled alone.
    systems = ("hetps", args.against) if args.wire in WIRES or args.against == "arith" else ("hetps",)
    steps, model = run_size(parser, args, args.steps, "--steps")
    started = time.perf_counter()
    torch.set_num_threads(TORCH_THREADS)
    console, log_dir = prepare_output(args.out)
    layout = Layout.from_named_shapes(MODELS[model](), 1)
    flat = seeded_parameters(layout.total_length)
    results: dict[str, Any] = {
        **run_header(None),
        "model": model,
        "parameters": layout.total_length,
        "wire": args.wire,
        "steps": steps,
        "systems": {},
    }
    fleet = Fleet(log_dir)
    try:
        for name in systems:
            path = log_dir / f"{name}.profile.json"
            system: StepSystem
            if name == "hetps":
                server = fleet.start_hetps(HetpsJob("hetps-profiled", model, "asgd", (), 0, 1), profile=path)
                system = HetpsStep([server.address], layout, "profiled", args.wire, flat)
            else:
                server = fleet.start_helper("bare-profiled", "bare", "benchmarks.harness.bare_grpc", profile=path)
                system = BareStep([server.address], layout, "profiled", args.wire, flat, arithmetic=name == "arith")
            try:
                results["systems"][name] = profile_system(
                    name, system, server, path, steps, 1 if args.smoke else 3, layout.total_length
                )
            finally:
                system.close()
    finally:
        fleet.stop()
    print_tables(results, console)
    results["wall_seconds"] = time.perf_counter() - started
    write_results("step_profile", argv, results, args.out, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
