"""How long a fresh process takes to get ready: a digits worker's task, and the ``psserver`` command.

    python -m benchmarks.start_up [--repeats 5] [--out benchmarks/results/start_up.json]

Every local cluster, demo and integration test starts one process per worker and per shard, so
their start-up is paid many times over. Each program below runs in a fresh Python process, the
programs taking turns round after round; wall seconds and the process's CPU seconds (user +
system, from ``resource.getrusage`` of the finished child) are recorded for each:

- ``torch``: ``import torch`` alone, the floor every worker and server pays;
- ``digits task``: loading the ``digits`` task as a worker does (``pstasks.tasks.load_task``);
- ``digits through scikit-learn``: the same images and split made by scikit-learn's
  ``load_digits`` and ``train_test_split``, as the task did before ``pstasks.digits``: the peer
  the task is compared with in the same run;
- ``psserver status --help``: an admin command, which imports neither torch nor the server;
- ``psserver serve --help``: the command that serves, which imports both (as every ``psserver``
  command did before the group imported ``serve`` lazily): the admin command's peer;
- ``4 workers, fresh`` and ``4 workers, warm``: four ``psworker train --help`` at once, as a local
  cluster starts its workers: each a fresh interpreter, against forks of one process that has
  imported torch (``pstools.warm_start``, the launcher's way; the forkserver's start included).
  The warm row's CPU counts the launching process alone (the forks are the forkserver's children),
  so the two are compared by wall time.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.harness.report import run_header, spread, write_results
from benchmarks.harness.stats import summarize

PROGRAMS: dict[str, list[str]] = {
    "torch": ["-c", "import torch"],
    "digits task": ["-c", "import torch; from pstasks.tasks import load_task; load_task('digits')"],
    "digits through scikit-learn": [
        "-c",
        "import torch; from sklearn.datasets import load_digits; from sklearn.model_selection import "
        "train_test_split; d = load_digits(); train_test_split(range(1797), test_size=0.2, random_state=0, "
        "stratify=d.target)",
    ],
    "psserver status --help": ["-m", "psserver", "status", "--help"],
    "psserver serve --help": ["-m", "psserver", "serve", "--help"],
    "4 workers, fresh": [
        "-c",
        "import subprocess, sys; ps = [subprocess.Popen([sys.executable, '-m', 'pstools', 'train', '--help'], "
        "stdout=subprocess.DEVNULL) for _ in range(4)]; assert [p.wait() for p in ps] == [0] * 4",
    ],
    "4 workers, warm": [
        "-c",
        "import os; from pathlib import Path; from pstools.warm_start import start_program; "
        "ps = [start_program('pstools', ['train', '--help'], Path(os.devnull)) for _ in range(4)]; "
        "assert [p.wait() for p in ps] == [0] * 4",
    ],
}
TASK, PEER = "digits task", "digits through scikit-learn"
ADMIN, SERVE = "psserver status --help", "psserver serve --help"
FRESH, WARM = "4 workers, fresh", "4 workers, warm"


def _child_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(arguments: Sequence[str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one fresh ``python ARGUMENTS``; a program that fails is an error."""
    cpu_before = _child_cpu_seconds()
    started = time.perf_counter()
    subprocess.run([sys.executable, *arguments], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started, _child_cpu_seconds() - cpu_before


def measure(repeats: int) -> dict[str, Any]:
    """Every program ``repeats`` times, taking turns; per program the wall and CPU summaries, and
    round by round the task's CPU against its peer's and the admin command's against ``serve``'s."""
    wall: dict[str, list[float]] = {name: [] for name in PROGRAMS}
    cpu: dict[str, list[float]] = {name: [] for name in PROGRAMS}
    for _ in range(repeats):
        for name, arguments in PROGRAMS.items():
            seconds, cpu_seconds = run_once(arguments)
            wall[name].append(seconds)
            cpu[name].append(cpu_seconds)
    return {
        "programs": {name: {"wall_s": summarize(wall[name]), "cpu_s": summarize(cpu[name])} for name in PROGRAMS},
        "task_vs_peer_cpu": summarize([a / b for a, b in zip(cpu[TASK], cpu[PEER], strict=True)]),
        "admin_vs_serve_cpu": summarize([a / b for a, b in zip(cpu[ADMIN], cpu[SERVE], strict=True)]),
        "warm_vs_fresh_wall": summarize([a / b for a, b in zip(wall[WARM], wall[FRESH], strict=True)]),
    }


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="rounds; every program runs once a round")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/start_up.json"))
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    console = Console()
    started = time.perf_counter()
    measured = measure(args.repeats)
    table = Table(title=f"a fresh process, {args.repeats} rounds taking turns: median (min–max) seconds")
    for column in ("program", "wall", "CPU"):
        table.add_column(column, justify="right")
    for name, result in measured["programs"].items():
        w, c = result["wall_s"], result["cpu_s"]
        table.add_row(
            name,
            f"{w['median']:.2f} ({spread(w, 2)})",
            f"{c['median']:.2f} ({spread(c, 2)})",
        )
    console.print(table)
    ratios = {
        "task_vs_peer_cpu": (TASK, PEER, "CPU"),
        "admin_vs_serve_cpu": (ADMIN, SERVE, "CPU"),
        "warm_vs_fresh_wall": (WARM, FRESH, "wall"),
    }
    for key, (name, peer, what) in ratios.items():
        ratio = measured[key]
        console.print(f"{name} vs {peer}, {what}: {ratio['median']:.2f}× ({spread(ratio, 2)}×)")
    results = {**run_header(None), **measured, "wall_seconds": time.perf_counter() - started}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_results("start_up", argv, results, args.out, console)
    return results


if __name__ == "__main__":
    main()
