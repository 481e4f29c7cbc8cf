"""The tables of ``benchmarks.scale``: the parameters and shards points, the levels of workers, the slopes."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def print_tables(results: dict[str, Any], console: Console) -> None:
    table = Table(title="Parameters and shards: one worker, ASGD, fp32 (median of the steps)")
    columns = ("parameters", "shards", "hetps ms", "bare ms", "hetps/bare", "start s", "Init s", "checkpoint s")
    for column in (*columns, "restore s", "worst peak RSS / limit MB"):
        table.add_column(column, justify="right")
    for point in results["parameters"]:
        head = (f"{point['parameters'] / 1e6:.3g}M", str(point["shards"]))
        if "servers" not in point:
            table.add_row(*head, f"skipped: {point['skipped']}" if "skipped" in point else f"error: {point['error']}")
            continue
        worst = max(point["servers"], key=lambda s: max(s["peak_rss_mb"], s["restored_peak_rss_mb"]) / s["limit_mb"])
        table.add_row(
            *head,
            *(f"{point['step_ms'][name]['median']:.1f}" for name in ("hetps", "bare")),
            f"{point['hetps_vs_bare_time']['median']:.2f}",
            *(f"{point[key]:.2f}" for key in ("start_s", "init_s", "checkpoint_s", "restore_s")),
            f"{max(worst['peak_rss_mb'], worst['restored_peak_rss_mb']):.0f} / {worst['limit_mb']:.0f}",
        )
    console.print(table)
    table = Table(title="Workers on one shard (~100k parameters), each its own connection")
    for column in ("consistency", "workers", "pushes/s", "rounds/s", "server CPU ms/push", "server peak RSS MB"):
        table.add_column(column, justify="right")
    table.add_column("problems")
    for consistency, data in results["workers"].items():
        if "error" in data:
            table.add_row(consistency, "", "", "", "", "", f"error: {data['error']}")
        for workers, level in data.get("levels", {}).items():
            if "not_run" in level:
                table.add_row(consistency, workers, "", "", "", "", f"not run: {level['not_run']}")
                continue
            problems = ", ".join(f"{count} {name}" for name, count in level["problems"].items())
            table.add_row(
                consistency,
                workers,
                f"{level['pushes_per_s']:.0f}",
                "" if level["rounds_per_s"] is None else f"{level['rounds_per_s']:.1f}",
                "" if level["server_cpu_ms_per_push"] is None else f"{level['server_cpu_ms_per_push']:.2f}",
                f"{level['server_peak_rss_mb']:.0f}",
                problems or "none",
            )
    console.print(table)
    for shards, fit in results["slopes"].items():
        seconds = fit["seconds_per_gb"]
        console.print(f"{shards} shard(s): hetps {seconds['hetps']:.3f} s/GB, bare {seconds['bare']:.3f} s/GB")
