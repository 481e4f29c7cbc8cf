"""How long one training step of the ``tinylm`` task takes on one CPU core.

    python -m benchmarks.tinylm_step [--steps 50] [--out benchmarks/results/tinylm_step.json]

One step is what a worker does per batch of 32 windows: forward, token cross-entropy, backward
and the task's AdamW step, on one torch thread, after a few untimed warm-up steps. Wall and
CPU seconds are both recorded: on a shared machine the wall time includes waiting for a core,
the process's CPU time does not. Target: a step well under 100 ms (median wall time at most 100 ms).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from benchmarks.harness.report import print_targets, run_header, target, write_results
from benchmarks.harness.stats import scaled, summarize
from pstasks.tasks import load_task

STEP_TARGET_MS = 100.0
WARMUP = 5


def measure(steps: int) -> dict[str, Any]:
    """Wall and CPU milliseconds of ``steps`` timed training steps of tinylm at its batch size."""
    torch.set_num_threads(1)
    task = load_task("tinylm")
    model = task.build_model()
    assert task.build_optimizer is not None
    optimizer = task.build_optimizer(model.parameters())
    generator = torch.Generator().manual_seed(0)
    wall: list[float] = []
    cpu: list[float] = []
    for step in range(WARMUP + steps):
        index = torch.randint(0, task.train_size, (task.batch_size,), generator=generator)
        started, started_cpu = time.perf_counter(), time.process_time()
        optimizer.zero_grad()
        task.loss(model(task.train_inputs[index]), task.train_targets[index]).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        if step >= WARMUP:
            wall.append(time.perf_counter() - started)
            cpu.append(time.process_time() - started_cpu)
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "batch_size": task.batch_size,
        "context": int(task.train_inputs.shape[1]),
        "wall_ms": scaled(summarize(wall), 1e3),
        "cpu_ms": scaled(summarize(cpu), 1e3),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50, help="timed steps (after warm-up)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/tinylm_step.json"))
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    console = Console()
    started = time.perf_counter()
    measured = measure(args.steps)
    table = Table(title=f"tinylm: one training step on one thread ({measured['parameters']:,} parameters)")
    for column in ("batch × context", "", "median ms", "q1–q3 ms", "min–max ms", "steps"):
        table.add_column(column, justify="right")
    for kind in ("wall_ms", "cpu_ms"):
        s = measured[kind]
        table.add_row(
            f"{measured['batch_size']} × {measured['context']}",
            kind.removesuffix("_ms"),
            f"{s['median']:.1f}",
            f"{s['q1']:.1f}–{s['q3']:.1f}",
            f"{s['min']:.1f}–{s['max']:.1f}",
            str(int(s["n"])),
        )
    console.print(table)
    goals = [target("tinylm step, wall ms", measured["wall_ms"], STEP_TARGET_MS, at_least=False)]
    print_targets(goals, console)
    results = {**run_header(None), **measured, "targets": goals, "wall_seconds": time.perf_counter() - started}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_results("tinylm_step", argv, results, args.out, console)


if __name__ == "__main__":
    main()
