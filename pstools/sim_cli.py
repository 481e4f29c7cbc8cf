"""``psworker simulate``: a virtual heterogeneous cluster in one process (see :mod:`pstools.simulate`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import torch
from rich.console import Console
from rich.table import Table

from pscli.config_file import ConfigFileError, build, read_toml
from pscli.help_sections import SectionedCommand
from psproto import codec
from pstasks.cli import DataFileError, data_dir_option
from pstasks.idx import IdxError
from pstasks.task_error import TaskError
from pstools.sim_config import SimSettings
from pstools.sim_tasks import sim_task
from pstools.simulate import SimConfig, SimulationError, SpeedModel, simulate
from psworker.cli_options import config_option
from psworker.task import Task

SIM_SECTIONS = {
    "Workers": ("workers", "speeds", "delay", "push_dtype"),
    "Model & rule": ("rule", "lr", "rule_opts", "consistency"),
    "Task & budget": ("task", "data_dir", "steps", "updates", "target", "target_accuracy"),
    "Output & configuration": ("json_path", "config_file"),
}


def _task(name: str, data_dir: Path | None) -> Task:
    try:
        return sim_task(name, data_dir)
    except TaskError as error:
        raise click.BadParameter(str(error), param_hint="--task") from None
    except IdxError as error:
        raise DataFileError(str(error)) from None


def _target(loaded: Task, task: str, target: float | None, target_accuracy: float | None) -> float | None:
    """--target, or --target-accuracy for a task judged by accuracy."""
    if target_accuracy is None:
        return target
    if target is not None:
        raise click.UsageError("give --target or --target-accuracy, not both")
    if loaded.metric.name != "accuracy":
        raise click.BadParameter(
            f"task {task} is judged by its {loaded.metric.label}, not accuracy; give --target",
            param_hint="--target-accuracy",
        )
    return target_accuracy


@click.command("simulate", cls=SectionedCommand, sections=SIM_SECTIONS)
@click.option("--workers", default=4, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--speeds",
    default="1:1:2:4",
    show_default=True,
    help="constant, ratios such as 1:1:2:4 (cycled over workers), exp or exp:1:1:2:4, or profile:LOG_DIR",
)
@click.option("--rule", default="asgd", show_default=True, help="update rule (see `psserver rules`)")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=None)
@click.option("--rule-opt", "rule_opts", multiple=True, metavar="KEY=VALUE")
@click.option("--consistency", default="async", show_default=True, type=click.Choice(["async", "ssp", "bsp"]))
@click.option(
    "--delay",
    type=click.IntRange(min=0),
    default=None,
    help="constant-delay mode: every gradient applied exactly D updates late (D + 1 workers)",
)
@click.option(
    "--task",
    default="digits",
    show_default=True,
    help="digits, digits-mlp, fashion, fashion-resnet18, tinylm or module:function",
)
@data_dir_option
@click.option("--steps", default=1000, show_default=True, type=click.IntRange(min=1), help="gradients, all workers")
@click.option("--updates", type=click.IntRange(min=1), default=None, help="also stop at this server clock")
@click.option(
    "--target",
    type=float,
    default=None,
    help="the task's metric to reach: a test accuracy (at least) or a validation loss (at most)",
)
@click.option(
    "--target-accuracy", type=click.FloatRange(0, 1), default=None, help="--target for a task judged by accuracy"
)
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option(
    "--push-dtype",
    default="fp32",
    show_default=True,
    type=click.Choice(sorted(codec.PUSH_DTYPE_NAMES)),
    help="what pushes are encoded in, decoded by the shard as from the wire (int8: 8-bit, error feedback)",
)
@config_option(
    "TOML file of the other settings (docs/configuration.md): step_seconds, ssp_bound, eval_every, seed, "
    "torch_threads, error_feedback"
)
def simulate_command(config_file: Path | None, **flags: Any) -> None:
    """Simulate WORKERS workers of different speeds in virtual time with the server's own rules."""
    from psserver.flags import parse_rule

    try:
        settings = build(SimSettings, read_toml(config_file)) if config_file is not None else SimSettings()
    except ConfigFileError as error:
        raise click.UsageError(f"--config {config_file}: {error}") from None
    spec = parse_rule(flags["rule"], flags["lr"], flags["rule_opts"])
    torch.set_num_threads(settings.torch_threads)
    loaded = _task(flags["task"], flags["data_dir"])
    target = _target(loaded, flags["task"], flags["target"], flags["target_accuracy"])
    try:
        config = SimConfig(
            rule=flags["rule"],
            options=spec.options.as_strings(),
            workers=flags["workers"],
            speeds=SpeedModel.parse(flags["speeds"], settings.step_seconds),
            consistency=flags["consistency"],
            ssp_bound=settings.ssp_bound,
            delay=flags["delay"],
            task=flags["task"],
            data_dir=str(flags["data_dir"]) if flags["data_dir"] is not None else None,
            steps=flags["steps"],
            max_updates=flags["updates"],
            eval_every=settings.eval_every,
            seed=settings.seed,
            target=target,
            push_dtype=flags["push_dtype"],
            error_feedback=settings.error_feedback,
        )
        result = simulate(config, loaded)
    except SimulationError as error:
        raise click.UsageError(str(error)) from None
    console = Console()
    table = Table("worker", "slowdown", "steps", "pushes", "steps/push", "staleness mean", "staleness max")
    for w in result.workers:
        table.add_row(
            f"sim-{w.rank}",
            f"{w.slowdown:g}×",
            str(w.steps),
            str(w.pushes),
            f"{w.steps_per_push:.1f}",
            f"{w.mean_staleness:.2f}",
            str(w.max_staleness),
        )
    console.print(table)
    telemetry = ", ".join(f"{k} {v:.3g}" for k, v in result.telemetry.items())
    console.print(
        f"{'DIVERGED; ' if result.diverged else ''}{loaded.metric.describe(result.test_accuracy, result.test_loss)} "
        f"after {result.clock} updates, {result.samples} samples, "
        f"{result.virtual_s:.1f} virtual s ({result.wall_s:.1f} s wall); mean staleness "
        f"{result.mean_staleness:.2f}" + (f"; {telemetry}" if telemetry else "")
    )
    if result.time_to_target_s is not None:
        console.print(f"reached {loaded.metric.label} {target} at {result.time_to_target_s:.1f} virtual s")
    if flags["json_path"] is not None:
        flags["json_path"].write_text(json.dumps(result.to_json(), indent=1))
