"""The cost curves of ``benchmarks.scale`` as PNG files: one figure per question, log axes where sizes span decades."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _by_shards(points: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    measured = [p for p in points if "servers" in p]
    return {s: [p for p in measured if p["shards"] == s] for s in sorted({p["shards"] for p in measured})}


def _step_time(results: dict[str, Any], path: Path) -> None:
    """Step time against the bytes a step moves: hetps solid, the bare mover dashed, both fits dotted."""
    figure, axis = plt.subplots(figsize=(7, 5))
    for index, (shards, row) in enumerate(_by_shards(results["parameters"]).items()):
        colour = f"C{index}"
        gigabytes = [p["bytes_per_step"] / 1e9 for p in row]
        for system, style in (("hetps", "o-"), ("bare", "s--")):
            seconds = [p["step_ms"][system]["median"] / 1e3 for p in row]
            axis.plot(gigabytes, seconds, style, color=colour, label=f"{system}, {shards} shard(s)")
        fit = results["slopes"].get(str(shards))
        if fit:
            axis.text(gigabytes[-1], seconds[-1], f" {fit['ratio']:.2f}x", color=colour, va="center")
    axis.set_xlabel("bytes a step moves (push + pull, GB)")
    axis.set_ylabel("step time (s, median)")
    axis.set_title("Step time against bytes: hetps and the bare gRPC mover\n(label: slope ratio hetps / bare)")
    axis.legend(fontsize=7)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _phases(results: dict[str, Any], path: Path) -> None:
    """Init, checkpoint, restore and start against parameters, per shard count."""
    figure, axes = plt.subplots(1, 4, figsize=(16, 4.2), sharey=True)
    titles = {"init_s": "Init", "checkpoint_s": "checkpoint (all shards)", "restore_s": "restore until ready"}
    titles["start_s"] = "first start until ready"
    for axis, (key, title) in zip(axes, titles.items(), strict=True):
        for index, (shards, row) in enumerate(_by_shards(results["parameters"]).items()):
            axis.plot([p["parameters"] / 1e6 for p in row], [p[key] for p in row], "o-", color=f"C{index}")
            axis.plot([], [], "o-", color=f"C{index}", label=f"{shards} shard(s)")
        axis.set_title(title)
        axis.set_xlabel("parameters (millions)")
        axis.set_xscale("log")
        axis.grid(alpha=0.3)
    axes[0].set_ylabel("seconds")
    axes[0].legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _server_rss(results: dict[str, Any], path: Path) -> None:
    """Each point's largest server peak RSS against its limit (2 x must-hold + 350 MB)."""
    figure, axis = plt.subplots(figsize=(7, 5))
    for index, (shards, row) in enumerate(_by_shards(results["parameters"]).items()):
        millions = [p["parameters"] / 1e6 for p in row]
        worst = [max(max(s["peak_rss_mb"], s["restored_peak_rss_mb"]) for s in p["servers"]) for p in row]
        limits = [max(s["limit_mb"] for s in p["servers"]) for p in row]
        axis.plot(millions, worst, "o-", color=f"C{index}", label=f"peak, {shards} shard(s)")
        axis.plot(millions, limits, ":", color=f"C{index}", label=f"limit, {shards} shard(s)")
    axis.set_xscale("log")
    axis.set_yscale("log")
    axis.set_xlabel("parameters (millions)")
    axis.set_ylabel("largest server peak RSS (MB)")
    axis.set_title("Server peak RSS against 2 x must-hold + 350 MB (one worker)")
    axis.legend(fontsize=7)
    axis.grid(alpha=0.3, which="both")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _workers(results: dict[str, Any], path: Path) -> None:
    """Push rate, server CPU per push and server peak RSS against workers, per consistency; a level
    with problems is drawn as a red cross."""
    figure, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    keys = (
        ("pushes_per_s", "acknowledged pushes/s"),
        ("server_cpu_ms_per_push", "server CPU ms per push"),
        ("server_peak_rss_mb", "server peak RSS MB"),
    )
    for axis, (key, title) in zip(axes, keys, strict=True):
        for index, (consistency, data) in enumerate(results["workers"].items()):
            levels = [(int(w), level) for w, level in data.get("levels", {}).items() if "not_run" not in level]
            values = [math.nan if lv[key] is None else lv[key] for _, lv in levels]
            axis.plot([w for w, _ in levels], values, "o-", color=f"C{index}", label=consistency)
            bad = [(w, v) for (w, lv), v in zip(levels, values, strict=True) if lv["problems"]]
            axis.plot([w for w, _ in bad], [v for _, v in bad], "x", color="red", markersize=12)
        axis.set_xscale("log", base=2)
        axis.set_xlabel("workers")
        axis.set_title(title)
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8, title="red x: problems")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_curves(results: dict[str, Any], folder: Path) -> list[Path]:
    """Every figure of ``results`` into ``folder``; the files written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    figures = {"step_time": _step_time, "phases": _phases, "server_rss": _server_rss, "workers": _workers}
    for name, draw in figures.items():
        path = folder / f"{name}.png"
        draw(results, path)
        written.append(path)
    return written
