"""What every benchmark script does around its measurement: options, the machine, targets, tables, JSON.

A script builds its :class:`~benchmarks.harness.settings.Settings` with :func:`parse_settings`,
measures, judges its targets with :func:`target`, prints its tables and the targets table
(:func:`print_targets`: PASS, MISS, or INVALID for a target that
``benchmarks.harness.validity.invalidate`` marked) and writes its results with
:func:`write_results`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import asdict, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import grpc
import torch
from rich.console import Console
from rich.table import Table

from benchmarks.harness.settings import TORCH_THREADS, Settings
from benchmarks.harness.stats import Summary
from psproto import codec
from psserver.allocator import WORKER, AllocatorConfig


def parse_settings(
    name: str, description: str | None, argv: Sequence[str] | None, repeats: bool = False
) -> tuple[Settings, Path]:
    """``--quick``, ``--smoke``, ``--out`` (and ``--repeats`` if asked) of ``python -m benchmarks.NAME``."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats and shorter bursts")
    parser.add_argument("--smoke", action="store_true", help="a tiny model and one step of everything (tests)")
    if repeats:
        parser.add_argument("--repeats", type=int, default=None, help="repeats of the step section")
    parser.add_argument("--out", type=Path, default=Path(f"benchmarks/results/{name}.json"))
    args = parser.parse_args(argv)
    settings = Settings.smoke() if args.smoke else Settings.quick() if args.quick else Settings()
    if repeats and args.repeats is not None:
        if args.repeats < 1:
            parser.error("--repeats must be at least 1")
        settings = replace(settings, repeats=args.repeats)
    return settings, args.out


def run_size(
    parser: argparse.ArgumentParser, args: argparse.Namespace, count: int | None, flag: str
) -> tuple[int, str]:
    """For a one-section script with ``--quick``, ``--smoke`` and ``--model``: how many timed repeats
    (``count`` as given by ``flag``, else 60, 20 quick, 3 smoke; below 1 a usage error) and which
    model (``--model``, else resnet18, tiny with ``--smoke``)."""
    repeats = count if count is not None else 3 if args.smoke else 20 if args.quick else 60
    if repeats < 1:
        parser.error(f"{flag} must be at least 1")
    return repeats, args.model or ("tiny" if args.smoke else "resnet18")


def prepare_output(out: Path) -> tuple[Console, Path]:
    """A console for the tables, and the folder beside ``out`` where the servers' logs go."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=180)  # tables in a log file or a pipe keep their columns
    out.parent.mkdir(parents=True, exist_ok=True)
    log_dir = out.parent / f"{out.stem}-logs"
    log_dir.mkdir(exist_ok=True)
    return console, log_dir


def run_header(settings: Settings | None) -> dict[str, Any]:
    """The date, the machine and the settings a results file opens with (a script outside the
    throughput family, which has settings of its own, passes None and records its own)."""
    header = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "grpc": grpc.__version__,
            "allocator": {"server": asdict(AllocatorConfig()), "worker": asdict(WORKER)},
        },
        "torch_threads_per_process": TORCH_THREADS,
        "chunk_bytes": codec.DEFAULT_CHUNK_BYTES,
    }
    if settings is not None:
        header["settings"] = asdict(settings)
    return header


def write_results(name: str, argv: Sequence[str] | None, results: dict[str, Any], out: Path, console: Console) -> None:
    """Record the command line in ``results`` and write them to ``out`` as JSON."""
    results["command"] = " ".join([f"python -m benchmarks.{name}", *(argv if argv is not None else sys.argv[1:])])
    out.write_text(json.dumps(results, indent=2))
    console.print(f"wrote {out} ({results['wall_seconds']:.0f} s)")


def target(name: str, summary: Summary, threshold: float, at_least: bool, detail: str = "") -> dict[str, Any]:
    """A target judged on ``summary``'s median: at least (or at most) ``threshold``."""
    value = summary["median"]
    passed = value >= threshold if at_least else value <= threshold
    return {
        "target": name,
        "measured": value,
        "min": summary["min"],
        "max": summary["max"],
        "threshold": threshold,
        "comparison": ">=" if at_least else "<=",
        "pass": bool(passed),
        "detail": detail,
    }


def spread(summary: Summary, digits: int = 1) -> str:
    """``min–max`` of ``summary``."""
    return f"{summary['min']:.{digits}f}–{summary['max']:.{digits}f}"


def result_word(entry: dict[str, Any]) -> str:
    """PASS, MISS, or INVALID (judged against a baseline that was out of line: never PASS)."""
    if entry.get("invalid"):
        return "INVALID"
    return "PASS" if entry["pass"] else "MISS"


_COLOURS = {"PASS": "green", "MISS": "red", "INVALID": "yellow"}


def print_validity(validity: dict[str, Any], console: Console) -> None:
    """The baseline checks that failed (or one line saying every one held)."""
    failed = [check for check in validity["checks"] if not check["ok"]]
    if not failed:
        console.print(f"Baselines held still: {len(validity['checks'])} checks passed.")
        return
    table = Table(title="Baselines out of line: the targets judged against them are INVALID")
    for column in ("check", "systems", "value", "bound", "why"):
        table.add_column(column, justify="right" if column == "value" else "left")
    for check in failed:
        table.add_row(
            check["check"], ", ".join(check["systems"]), f"{check['value']:.2f}", check["bound"], check["why"]
        )
    console.print(table)


def print_targets(targets: list[dict[str, Any]], console: Console) -> None:
    table = Table(title="Targets")
    for column in ("target", "measured (median)", "min–max", "target", "result"):
        table.add_column(column, justify="left" if column == "target" else "right")
    for entry in targets:
        digits = 0 if entry["target"].startswith("peak RSS") else 2
        table.add_row(
            entry["target"] + (f" [{entry['detail']}]" if entry["detail"] else ""),
            f"{entry['measured']:.{digits}f}",
            f"{entry['min']:.{digits}f}–{entry['max']:.{digits}f}",
            f"{entry['comparison']} {entry['threshold']:.{digits}f}",
            f"[{_COLOURS[result_word(entry)]}]{result_word(entry)}[/{_COLOURS[result_word(entry)]}]",
        )
    console.print(table)
