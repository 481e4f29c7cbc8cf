"""Run a server (``psserver serve`` or the bare gRPC mover) under yappi's CPU-clock profiler.

    python -m benchmarks.harness.profiled --stats OUT.json psserver serve ...
    python -m benchmarks.harness.profiled --stats OUT.json bare --torch-threads 1 ...

The allocator settings are applied first, as each server's own entry point does (the process
re-executes itself once with them set), so the profiled process moves memory as the
unprofiled one does; then the server runs, unprofiled until SIGUSR2 starts yappi (from zero,
with builtins such as torch's ``copy_`` and ``bytes.join`` counted; ``--stats``.started says
it did). On SIGUSR1 the profile stops and is written to ``--stats``
(:func:`write_profile`): CPU seconds per function over every Python thread but the main
one (which only waits for termination), per-thread totals, and the CPU time of each OS thread
of the process from ``/proc`` (gRPC's C-core threads, which yappi cannot see, included), at the
start and at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

SERVERS = ("psserver", "bare")


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds of every OS thread of ``pid`` so far, by ``NAME/TID``."""
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except FileNotFoundError:
            continue  # the thread ended while the folder was read
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        found[f"{name}/{tid}"] = (int(fields[11]) + int(fields[12])) / tick
    return found


_threads_at_start: dict[str, float] = {}


def start_profile(path: Path) -> None:
    """Note every OS thread's CPU now and start yappi from zero; then ``path``.started."""
    import yappi

    yappi.stop()
    yappi.clear_stats()
    _threads_at_start.clear()
    _threads_at_start.update(thread_cpu_seconds(os.getpid()))
    yappi.set_clock_type("cpu")
    yappi.start(builtins=True)
    path.with_suffix(path.suffix + ".started").write_text("")


def write_profile(path: Path) -> None:
    """Stop yappi and write what it and ``/proc`` measured to ``path`` (JSON, then ``path``.done)."""
    import yappi

    yappi.stop()
    functions = [
        {
            "module": stat.module,
            "name": stat.name,
            "line": stat.lineno,
            "calls": stat.ncall,
            "own_s": stat.tsub,
            "total_s": stat.ttot,
        }
        for stat in yappi.get_func_stats(filter_callback=lambda stat: stat.ctx_id != 0)
    ]
    threads = [{"name": t.name, "id": t.id, "cpu_s": t.ttot} for t in yappi.get_thread_stats()]
    profile: dict[str, Any] = {
        "functions": functions,
        "threads": threads,
        "os_threads_at_start": _threads_at_start,
        "os_threads": thread_cpu_seconds(os.getpid()),
    }
    path.write_text(json.dumps(profile))
    path.with_suffix(path.suffix + ".done").write_text("")


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.harness.profiled", description=__doc__)
    parser.add_argument("--stats", type=Path, required=True, help="where the profile is written (JSON)")
    parser.add_argument("server", choices=SERVERS)
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the server's own arguments")
    parsed = parser.parse_args(argv)
    out, server, args = parsed.stats, parsed.server, parsed.args
    if server != "psserver":  # psserver serve applies its own
        from psserver.allocator import AllocatorConfig, apply_allocator

        apply_allocator(AllocatorConfig())
    signal.signal(signal.SIGUSR2, lambda *_: start_profile(out))
    signal.signal(signal.SIGUSR1, lambda *_: write_profile(out))
    if server == "psserver":
        from psserver.cli import main as psserver_main

        sys.argv = ["psserver", *args]
        psserver_main()
    else:
        from benchmarks.harness import bare_grpc

        bare_grpc.main(args)


if __name__ == "__main__":
    main(sys.argv[1:])
