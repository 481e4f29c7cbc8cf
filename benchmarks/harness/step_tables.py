"""The tables ``benchmarks.step_round_trip`` (and the throughput script's steps section) prints."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from benchmarks.harness.report import spread


def print_step_tables(steps: dict[str, Any], console: Console) -> None:
    for model, data in steps.items():
        table = Table(title=f"Worker step (push + pull), {model}: {data['parameters']:,} parameters")
        step_columns = (
            "system",
            "median ms",
            "IQR ms",
            "min–max ms",
            "steps/s",
            "GB/s each way",
            "server CPU ms",
            "client CPU ms",
            "cores busy",
        )
        for column in step_columns:
            table.add_column(column, justify="left" if column == "system" else "right")
        for name, system in data["systems"].items():
            step = system["step_ms"]
            used = system["cpu_ms_per_step"]
            table.add_row(
                name,
                f"{step['median']:.1f}" if step["median"] >= 1 else f"{step['median']:.3f}",
                f"{step['q1']:.1f}–{step['q3']:.1f}" if step["median"] >= 1 else f"{step['q1']:.3f}–{step['q3']:.3f}",
                spread(step, 1 if step["median"] >= 1 else 3),
                f"{system['steps_per_s']:.1f}",
                f"{system['gb_per_s_each_way']:.3f}",
                f"{used['server']:.1f}",
                f"{used['client']:.1f}",
                f"{used['busy_cores']:.2f}",
            )
        console.print(table)
        ratios = Table(title=f"Speed ratios per repeat, {model}: A vs B = B's time / A's time (> 1: A is faster)")
        for column in ("pair", "median", "IQR", "min–max", "fastest steps"):
            ratios.add_column(column, justify="left" if column == "pair" else "right")
        for pair, summary in data["speed_ratios"].items():
            ratios.add_row(
                pair,
                f"{summary['median']:.2f}",
                f"{summary['q1']:.2f}–{summary['q3']:.2f}",
                spread(summary, 2),
                f"{summary['of_fastest_steps']:.2f}",
            )
        console.print(ratios)


def print_step_limits(limits: dict[str, Any], console: Console) -> None:
    """Speed ratios (medians over repeats) that split a row's distance from its ceiling into the
    step's arithmetic (the bare mover doing it against the bare mover) and hetps's own work, and
    what the arithmetic mover gains by applying span by span as it replies ("overlap vs arith");
    a baseline that did not hold still (the validity checks) is named in the last column."""
    ratios = ("hetps vs bare", "arith vs bare", "hetps vs arith", "hetps vs peer", "arith vs peer", "overlap vs arith")
    for model, rows in limits.items():
        table = Table(title=f"What the step's arithmetic costs, {model} (speed ratios, > 1: the first is faster)")
        for column in ("row", *ratios, "out of line"):
            table.add_column(column, justify="left" if column in ("row", "out of line") else "right")
        for row, measured in rows.items():
            shown = ("—" if measured[key] is None else f"{measured[key]:.2f}" for key in ratios)
            table.add_row(row, *shown, ", ".join(measured["out_of_line"]) or "—")
        console.print(table)
