"""How the server's HTTP/2 receive window moves a worker's step time and the server's memory.

    python -m benchmarks.receive_window [--quick] [--windows auto,64KiB,1MiB,4MiB]
    python -m benchmarks.receive_window --windows 4MiB,4MiB+MALLOC_MMAP_THRESHOLD_=131072

One hetps shard (ResNet-18 size, ASGD unless ``--rule``, fp32 on the wire) per window setting
(``receive_window_bytes`` in the ``[transport]`` table of ``psserver serve --config``), all
running at once on loopback. A setting may add environment variables for its server after ``+``;
``psserver serve`` sets its allocator with ``mallopt`` as it starts (psserver.allocator), over
what glibc read from ``MALLOC_*`` variables.

1. **steps** — one worker in this process per server, one step (push + pull) of each in
   turn, the order rotated every round; every window's speed against the first window's
   (``auto``: gRPC sizes it) in the same repeat: the first's median step time over this
   one's, so above 1 is faster.
2. **concurrency** — ``workers`` worker processes joined to every server. Per server an
   untimed warm-up burst of all of them at once, then timed bursts, servers in rotating
   order; aggregate steps/s over the first window's, burst by burst, and each server's
   peak RSS (VmHWM) after the step section and after its bursts. The table's title gives
   the limit benchmarks/server_memory.py holds peaks to (1.5x the bytes the server must hold,
   plus 300 MB).

Prints a table and writes JSON (``--out``, default benchmarks/results/receive_window.json).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import click
import torch
from rich.console import Console
from rich.table import Table

from benchmarks.harness.memory import rss_limit_mb, rule_state_bytes
from benchmarks.harness.models import MODELS
from benchmarks.harness.pool import PoolTarget, WorkerPool
from benchmarks.harness.processes import Fleet, HetpsJob, ServerProcess, vm_mb
from benchmarks.harness.report import prepare_output
from benchmarks.harness.settings import TORCH_THREADS
from benchmarks.harness.stats import summarize
from benchmarks.harness.steps import HetpsStep, initialize_parameters, time_steps
from psproto.layout import Layout
from psserver.allocator import WORKER, AllocatorConfig, apply_allocator
from psserver.flags import parse_receive_window

DEFAULT_WINDOWS = ("auto", "64KiB", "1MiB", "4MiB")
_VARIABLE = re.compile(r"^[A-Z_][A-Z0-9_]*$")


@dataclass(frozen=True)
class ServerSetting:
    """One compared server: its window (``transport.receive_window_bytes``) and what it adds to its environment."""

    window: str
    window_bytes: int | None  # None: gRPC sizes the window
    environment: dict[str, str]

    @property
    def identity(self) -> tuple[int | None, tuple[tuple[str, str], ...]]:
        """Equal for settings that would run the same server (``4MiB`` and ``4194304``)."""
        return self.window_bytes, tuple(sorted(self.environment.items()))


def parse_setting(text: str) -> ServerSetting:
    """``WINDOW[+NAME=VALUE...]``; raises ValueError saying what is wrong."""
    window, *assignments = (part.strip() for part in text.split("+"))
    try:
        window_bytes = parse_receive_window(window)
    except click.BadParameter as error:
        raise ValueError(error.message) from None
    environment: dict[str, str] = {}
    for assignment in assignments:
        name, equals, value = assignment.partition("=")
        if not equals or not _VARIABLE.match(name):
            raise ValueError(f"{assignment!r} in {text!r} is not NAME=VALUE with an upper-case NAME")
        environment[name] = value
    return ServerSetting(window, window_bytes, environment)


@dataclass(frozen=True)
class Settings:
    model: str = "resnet18"
    rule: str = "asgd"
    rule_opts: tuple[str, ...] = ()
    windows: tuple[str, ...] = DEFAULT_WINDOWS
    repeats: int = 5
    warmup: int = 2
    steps: int = 6
    workers: int = 16
    bursts: int = 3
    burst_seconds: float = 6.0

    @classmethod
    def quick(cls) -> Settings:
        return cls(repeats=3, warmup=1, steps=4, bursts=2, burst_seconds=4.0)

    @classmethod
    def smoke(cls) -> Settings:
        return cls(
            model="tiny",
            windows=("auto", "64KiB"),
            repeats=2,
            warmup=1,
            steps=2,
            workers=2,
            bursts=1,
            burst_seconds=0.3,
        )


def process_environment(pid: int) -> dict[str, str]:
    """The environment process ``pid`` started its current program with (``/proc/PID/environ``)."""
    entries = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode(errors="replace").partition("=")[::2] for entry in entries if entry)


def measure_steps(settings: Settings, servers: dict[str, ServerProcess], console: Console) -> dict[str, Any]:
    """Single-worker step times per window, interleaved step by step; ratios within each repeat."""
    shapes = MODELS[settings.model]()
    layout = Layout.from_named_shapes(shapes)
    generator = torch.Generator().manual_seed(0)
    flat = torch.randn(layout.total_length, generator=generator) * 0.01
    update = torch.randn(layout.total_length, generator=generator) * 1e-4
    out = torch.empty(layout.total_length)
    systems = {
        window: HetpsStep([server.address], layout, f"window-{window}", "fp32", flat)
        for window, server in servers.items()
    }
    per_repeat: dict[str, list[float]] = {window: [] for window in systems}
    try:
        for system in systems.values():
            time_steps(system, update, out, settings.warmup)
        order = list(systems)
        with console.status("steps") as status:
            for repeat in range(settings.repeats):
                status.update(f"steps: repeat {repeat + 1}/{settings.repeats}")
                taken: dict[str, list[float]] = {window: [] for window in systems}
                for round_index in range(settings.steps):
                    shift = (repeat * settings.steps + round_index) % len(order)
                    for window in order[shift:] + order[:shift]:
                        taken[window] += time_steps(systems[window], update, out, 1)
                        if not bool(torch.isfinite(out).all()):
                            raise RuntimeError(f"the server with window {window} returned non-finite parameters")
                for window, samples in taken.items():
                    per_repeat[window].append(statistics.median(samples))
    finally:
        for system in systems.values():
            system.close()
    first = per_repeat[order[0]]
    return {
        window: {
            "step_ms": summarize([t * 1e3 for t in times]),
            f"speed_vs_{order[0]}": summarize([f / t for f, t in zip(first, times, strict=True)]),
        }
        for window, times in per_repeat.items()
    }


def measure_concurrency(
    settings: Settings, servers: dict[str, ServerProcess], pool: WorkerPool, console: Console
) -> dict[str, Any]:
    """Aggregate steps/s of every pool worker at once, per window, and each server's peak RSS after."""
    order = list(servers)
    rates: dict[str, list[float]] = {window: [] for window in order}
    errors = dict.fromkeys(order, 0)
    first_error = dict.fromkeys(order, "")
    with console.status("concurrency") as status:
        for window in order:
            status.update(f"concurrency: warming up window {window}")
            pool.burst(window, settings.workers, max(0.2, settings.burst_seconds / 3))
        for burst in range(settings.bursts):
            shift = burst % len(order)
            for window in order[shift:] + order[:shift]:
                status.update(f"concurrency: window {window}, burst {burst + 1}/{settings.bursts}")
                reports = pool.burst(window, settings.workers, settings.burst_seconds)
                rates[window].append(sum(r["steps"] / r["elapsed"] for r in reports))
                errors[window] += sum(int(r["errors"]) for r in reports)
                first_error[window] = first_error[window] or next((r["error"] for r in reports if r["error"]), "")
    first = rates[order[0]]
    return {
        window: {
            "workers": settings.workers,
            "aggregate_steps_per_s": summarize(rates[window]),
            f"speed_vs_{order[0]}": summarize([r / f for f, r in zip(first, rates[window], strict=True)]),
            "errors": errors[window],
            "first_error": first_error[window],
            "peak_rss_mb": vm_mb(servers[window].pid, "VmHWM"),
        }
        for window in order
    }


def run(settings: Settings, log_dir: Path, console: Console) -> dict[str, Any]:
    torch.set_num_threads(TORCH_THREADS)
    started = time.perf_counter()
    length = Layout.from_named_shapes(MODELS[settings.model]()).total_length
    state, needs_snapshot = rule_state_bytes(settings.rule, settings.rule_opts, length)
    # The parameters, the rule's state, and a snapshot per worker for rules that measure gaps.
    must_hold_mb = (length * 4 * (1 + (settings.workers if needs_snapshot else 0)) + state) / 1e6
    results: dict[str, Any] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "settings": asdict(settings),
        "allocator": asdict(AllocatorConfig()),
        "must_hold_mb": must_hold_mb,
        "rss_limit_mb": rss_limit_mb(must_hold_mb),
    }
    chosen = {label: parse_setting(label) for label in settings.windows}
    fleet = Fleet(log_dir)
    try:
        with console.status("starting servers"):
            servers = {
                label: fleet.start_hetps(
                    HetpsJob(
                        f"window-{label}",
                        settings.model,
                        settings.rule,
                        settings.rule_opts,
                        0,
                        1,
                        config={"transport": {"receive_window_bytes": setting.window_bytes or "auto"}},
                    ),
                    environment=setting.environment,
                )
                for label, setting in chosen.items()
            }
            for server in servers.values():
                initialize_parameters(settings.model, [server.address])
        results["server_commands"] = {window: list(map(str, s.process.args)) for window, s in servers.items()}  # type: ignore[arg-type]
        # What each server process really runs with.
        results["server_environment"] = {
            label: {
                name: value
                for name, value in process_environment(server.pid).items()
                if name in chosen[label].environment
            }
            for label, server in servers.items()
        }
        results["steps"] = measure_steps(settings, servers, console)
        for window, server in servers.items():
            results["steps"][window]["peak_rss_mb"] = vm_mb(server.pid, "VmHWM")
        targets = [PoolTarget(window, settings.model, (s.address,), settings.workers) for window, s in servers.items()]
        with console.status(f"starting {settings.workers} worker processes"):
            pool = WorkerPool(settings.workers, targets)
        try:
            results["concurrency"] = measure_concurrency(settings, servers, pool, console)
        finally:
            pool.close()
    finally:
        fleet.stop()
    results["wall_seconds"] = time.perf_counter() - started
    return results


def print_table(results: dict[str, Any], console: Console) -> None:
    windows = list(results["steps"])
    first = windows[0]
    limit = results["rss_limit_mb"]
    workers = results["settings"]["workers"]
    rule = results["settings"]["rule"]
    table = Table(
        title=f"receive window ({rule}): one worker's step, then {workers} workers at once (RSS limit {limit:.0f} MB)"
    )
    for column in (
        "window",
        "step ms (IQR)",
        f"step speed vs {first}",
        "peak RSS, 1 worker",
        f"{workers} workers steps/s",
        f"vs {first}",
        "errors",
        f"peak RSS, {workers} workers",
    ):
        table.add_column(column, justify="left" if column == "window" else "right")
    for window in windows:
        step = results["steps"][window]
        load = results["concurrency"][window]
        ms = step["step_ms"]
        table.add_row(
            window,
            f"{ms['median']:.1f} ({ms['q1']:.1f}-{ms['q3']:.1f})",
            f"{step[f'speed_vs_{first}']['median']:.2f}x",
            f"{step['peak_rss_mb']:.0f} MB",
            f"{load['aggregate_steps_per_s']['median']:.1f}",
            f"{load[f'speed_vs_{first}']['median']:.2f}x",
            str(load["errors"]),
            f"{load['peak_rss_mb']:.0f} MB",
        )
    console.print(table)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats and shorter bursts")
    parser.add_argument("--smoke", action="store_true", help="a tiny model, two workers (tests)")
    parser.add_argument(
        "--windows",
        default=None,
        help="comma-separated windows (auto or a size), each optionally +NAME=VALUE for the server's environment; "
        "the first is the base",
    )
    parser.add_argument("--workers", type=int, default=None, help="worker processes in the concurrency section")
    parser.add_argument("--rule", default=None, help="the servers' update rule (default asgd)")
    parser.add_argument("--rule-opt", action="append", default=[], help="a rule option KEY=VALUE (repeatable)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/receive_window.json"))
    args = parser.parse_args(argv)
    settings = Settings.smoke() if args.smoke else Settings.quick() if args.quick else Settings()
    if args.windows is not None:
        windows = tuple(w.strip() for w in args.windows.split(",") if w.strip())
        try:
            parsed = [parse_setting(window) for window in windows]
        except ValueError as error:
            parser.error(f"--windows: {error}")
        if len(windows) < 2 or len({setting.identity for setting in parsed}) != len(windows):
            parser.error("--windows needs at least two different settings")
        settings = replace(settings, windows=windows)
    if args.workers is not None:
        if args.workers < 1:
            parser.error("--workers must be at least 1")
        settings = replace(settings, workers=args.workers)
    if args.rule is not None or args.rule_opt:
        settings = replace(settings, rule=args.rule or settings.rule, rule_opts=tuple(args.rule_opt))
    console, log_dir = prepare_output(args.out)
    results = run(settings, log_dir, console)
    given = argv if argv is not None else sys.argv[1:]
    results["command"] = " ".join(["python -m benchmarks.receive_window", *given])
    print_table(results, console)
    args.out.write_text(json.dumps(results, indent=2))
    console.print(f"wrote {args.out} ({results['wall_seconds']:.0f} s)")
    return results


if __name__ == "__main__":
    apply_allocator(WORKER)
    main()
