"""``psworker simulate``: a virtual heterogeneous cluster in one process (see :mod:`pstools.simulate`)."""

from __future__ import annotations

import json
from pathlib import Path

import click
import torch
from rich.console import Console
from rich.table import Table

from psproto import codec
from pstasks.cli import DataFileError, data_dir_option
from pstasks.idx import IdxError
from pstasks.task_error import TaskError
from pstools.sim_tasks import sim_task
from pstools.simulate import SimConfig, SimulationError, SpeedModel, simulate


@click.command("simulate")
@click.option("--workers", default=4, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--speeds",
    default="1:1:2:4",
    show_default=True,
    help="constant, ratios such as 1:1:2:4 (cycled over workers), exp or exp:1:1:2:4, or profile:LOG_DIR",
)
@click.option("--step-seconds", default=1.0, show_default=True, type=click.FloatRange(min=0, min_open=True))
@click.option("--rule", default="asgd", show_default=True, help="update rule (see `psserver rules`)")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=None)
@click.option("--rule-opt", "rule_opts", multiple=True, metavar="KEY=VALUE")
@click.option("--consistency", default="async", show_default=True, type=click.Choice(["async", "ssp", "bsp"]))
@click.option("--ssp-bound", default=3, show_default=True, type=click.IntRange(min=0))
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
@click.option("--eval-every", default=100, show_default=True, type=click.IntRange(min=1), help="in steps")
@click.option(
    "--target",
    type=float,
    default=None,
    help="the task's metric to reach: a test accuracy (at least) or a validation loss (at most)",
)
@click.option(
    "--target-accuracy", type=click.FloatRange(0, 1), default=None, help="--target for a task judged by accuracy"
)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--torch-threads", default=1, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--push-dtype",
    default="fp32",
    show_default=True,
    type=click.Choice(sorted(codec.PUSH_DTYPE_NAMES)),
    help="what pushes are encoded in, decoded by the shard as from the wire (int8: 8-bit, error feedback)",
)
@click.option(
    "--error-feedback/--no-error-feedback",
    default=True,
    show_default=True,
    help="with --push-dtype int8, carry each push's quantisation error into the next push",
)
def simulate_command(
    workers: int,
    speeds: str,
    step_seconds: float,
    rule: str,
    lr: float | None,
    rule_opts: tuple[str, ...],
    consistency: str,
    ssp_bound: int,
    delay: int | None,
    task: str,
    data_dir: Path | None,
    steps: int,
    updates: int | None,
    eval_every: int,
    target: float | None,
    target_accuracy: float | None,
    seed: int,
    json_path: Path | None,
    torch_threads: int,
    push_dtype: str,
    error_feedback: bool,
) -> None:
    """Simulate WORKERS workers of different speeds in virtual time with the server's own rules."""
    from psserver.flags import parse_rule

    spec = parse_rule(rule, lr, rule_opts)
    torch.set_num_threads(torch_threads)
    if target is not None and target_accuracy is not None:
        raise click.UsageError("give --target or --target-accuracy, not both")
    try:
        loaded = sim_task(task, data_dir)
    except TaskError as error:
        raise click.BadParameter(str(error), param_hint="--task") from None
    except IdxError as error:
        raise DataFileError(str(error)) from None
    if target_accuracy is not None:
        if loaded.metric.name != "accuracy":
            raise click.BadParameter(
                f"task {task} is judged by its {loaded.metric.label}, not accuracy; give --target",
                param_hint="--target-accuracy",
            )
        target = target_accuracy
    try:
        config = SimConfig(
            rule=rule,
            options=spec.options.as_strings(),
            workers=workers,
            speeds=SpeedModel.parse(speeds, step_seconds),
            consistency=consistency,
            ssp_bound=ssp_bound,
            delay=delay,
            task=task,
            data_dir=str(data_dir) if data_dir is not None else None,
            steps=steps,
            max_updates=updates,
            eval_every=eval_every,
            seed=seed,
            target=target,
            push_dtype=push_dtype,
            error_feedback=error_feedback,
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
    if json_path is not None:
        json_path.write_text(json.dumps(result.to_json(), indent=1))
