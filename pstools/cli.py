"""The tools' commands of ``psworker``: ``cluster``, ``export`` and ``simulate``, added to psworker's group.

They run both sides on one machine (or read the server's checkpoints), so they live here and
not in :mod:`pstasks.cli`; :data:`main` is psworker's click group with them added, which the
``psworker`` console script runs (:mod:`pstools.entry`).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import click
import grpc
from rich.console import Console
from rich.table import Table

from psserver.config_file import ConfigFileError, merged, read_toml
from pstasks.cli import DataFileError, data_dir_option, main, server_failure
from pstasks.idx import IdxError
from pstasks.task_error import TaskError
from pstasks.tasks import load_task
from pstools.export import ExportError, named_tensors, save_state_dict, state_dict_from_checkpoints
from pstools.launcher import ClusterConfig, ClusterError, run_cluster
from pstools.sim_cli import simulate_command
from psworker.binding import ModelBinding
from psworker.cli_options import client_security_from_flags, client_security_options, wire_dtype_options
from psworker.client import ClientConfig, PSClient, ServerMismatchError

__all__ = ["main"]


def _parse_slowdowns(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not a comma-separated list of numbers", param_hint="--slowdowns"
        ) from None
    if not values or any(v < 1.0 for v in values):
        raise click.BadParameter("every slowdown must be >= 1 (1 = full speed)", param_hint="--slowdowns")
    return values


def _dtype_args(
    push_dtype: str | None, pull_dtype: str | None, error_feedback: bool, chunk_bytes: int
) -> tuple[str, ...]:
    """The `psworker train` options that carry the cluster's push and pull dtypes and chunk size to its workers."""
    args: tuple[str, ...] = ("--chunk-size", str(chunk_bytes))
    if not error_feedback:
        args += ("--no-error-feedback",)
    if push_dtype is not None:
        args += ("--push-dtype", push_dtype)
    if pull_dtype is not None:
        args += ("--pull-dtype", pull_dtype)
    return args


@main.command()
@click.option("--workers", default=4, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--slowdowns",
    default="1,1,2,4",
    show_default=True,
    help="comma-separated slowdown per worker (1 = full speed); must list one per worker",
)
@click.option("--rule", default="asgd", show_default=True, help="update rule (see `psserver rules`)")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=None)
@click.option("--rule-opt", "rule_opts", multiple=True, metavar="KEY=VALUE")
@click.option(
    "--task",
    default="digits",
    show_default=True,
    help="built-in task (digits, fashion, fashion-resnet18, tinylm) or module:function",
)
@data_dir_option
@click.option(
    "--shard-data/--no-shard-data",
    default=None,
    help="worker r trains on part r of WORKERS disjoint parts of the training set "
    "(default: as the task says; the fashion tasks do, digits does not)",
)
@click.option(
    "--updates",
    default=1500,
    show_default=True,
    type=click.IntRange(min=1),
    help="train until the server has applied this many updates",
)
@click.option("--shards", default=1, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--consistency",
    default="async",
    show_default=True,
    type=click.Choice(["async", "ssp", "bsp"]),
    help="consistency model in front of the rule",
)
@click.option("--ssp-bound", default=3, show_default=True, type=click.IntRange(min=0), help="SSP's bound s")
@wire_dtype_options
@click.option("--device", default="auto", show_default=True)
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--log-dir", default=Path("runs/latest"), show_default=True, type=click.Path(path_type=Path))
@click.option("--timeout", default=600.0, show_default=True, type=click.FloatRange(min=1))
@click.option(
    "--server-config",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="a `psserver serve --config` TOML file, passed on to every shard",
)
def cluster(
    workers: int,
    slowdowns: str,
    rule: str,
    lr: float | None,
    rule_opts: tuple[str, ...],
    task: str,
    data_dir: Path | None,
    shard_data: bool | None,
    updates: int,
    shards: int,
    consistency: str,
    ssp_bound: int,
    wire_dtype: str,
    push_dtype: str | None,
    pull_dtype: str | None,
    chunk_size: int,
    error_feedback: bool,
    device: str,
    seed: int,
    log_dir: Path,
    timeout: float,
    server_config: Path | None,
) -> None:
    """Run a server and WORKERS workers of different speeds on this machine, then report."""
    speeds = _parse_slowdowns(slowdowns)
    if len(speeds) != workers:
        raise click.BadParameter(f"{len(speeds)} slowdown(s) for {workers} worker(s)", param_hint="--slowdowns")
    # The local launcher runs the server too: check the rule with the server's own parser (and
    # its message) before starting anything. Imported here: `psworker train` never needs it.
    from psserver.flags import parse_rule

    parse_rule(rule, lr, rule_opts)
    try:
        server_table = read_toml(server_config) if server_config is not None else {}
    except ConfigFileError as error:
        raise click.BadParameter(str(error), param_hint="--server-config") from None
    config = ClusterConfig(
        workers,
        speeds,
        rule,
        lr,
        rule_opts,
        task,
        updates,
        shards,
        wire_dtype,
        log_dir,
        device,
        seed,
        server_args=("--consistency", consistency, "--ssp-bound", str(ssp_bound)),
        timeout_s=timeout,
        # One chunk size both ways: the servers cut pulled parameters as the workers cut pushes.
        server_config=merged(server_table, {"shard": {"chunk_bytes": chunk_size}}),
        data_dir=data_dir,
        shard_data=shard_data,
        worker_args=_dtype_args(push_dtype, pull_dtype, error_feedback, chunk_size),
    )
    console = Console()
    console.print(
        f"hetps local cluster: rule [bold]{rule}[/] ({consistency}), {workers} workers (slowdowns {slowdowns}), "
        f"{shards} shard(s), {updates} updates, logs in {log_dir}"
    )
    try:
        report = run_cluster(config)
    except ClusterError as error:
        raise click.ClickException(str(error)) from None
    except IdxError as error:
        raise DataFileError(str(error)) from None
    table = Table("worker", "slowdown", "steps", "pushes", "staleness mean", "staleness max", "s/step")
    for w in report.workers:
        table.add_row(
            w.name,
            f"{w.slowdown:g}×",
            str(w.steps),
            str(w.pushes),
            f"{w.mean_staleness:.2f}",
            str(w.max_staleness),
            f"{w.compute_seconds_per_step * 1000:.1f} ms",
        )
    console.print(table)
    console.print(f"final {report.describe()} after {report.clock} updates in {report.wall_seconds:.1f} s")
    sys.stdout.flush()


@main.command("export")
@click.option(
    "--out", required=True, type=click.Path(dir_okay=False, path_type=Path), help="FILE.safetensors or FILE.pt"
)
@click.option(
    "--checkpoint",
    "checkpoints",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="a shard's checkpoint file or --checkpoint-dir (its newest); one per shard",
)
@click.option("--server", "servers", multiple=True, help="HOST:PORT of a running shard; one per shard, in order")
@click.option("--task", default=None, help="with --server: the task whose model the server trains")
@client_security_options
def export_command(
    out: Path,
    checkpoints: tuple[Path, ...],
    servers: tuple[str, ...],
    task: str | None,
    tls_ca: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    auth_token_file: Path | None,
) -> None:
    """Write the trained model as a state dict (safetensors or PyTorch) that loads into the module.

    From checkpoints (no model code needed) or from running shards (pulled as an observer).
    """
    if bool(checkpoints) == bool(servers):
        raise click.UsageError("give either --checkpoint (one per shard) or --server (one per shard) with --task")
    if checkpoints:
        try:
            tensors = state_dict_from_checkpoints(checkpoints)
        except ExportError as error:
            raise click.BadParameter(str(error), param_hint="--checkpoint") from None
    else:
        if task is None:
            raise click.UsageError("--server needs --task: the model's layout comes from the task")
        try:
            model = load_task(task).build_model()
        except TaskError as error:
            raise click.BadParameter(str(error), param_hint="--task") from None
        except IdxError as error:
            raise DataFileError(str(error)) from None
        tls, token = client_security_from_flags(tls_ca, tls_cert, tls_key, auth_token_file)
        binding = ModelBinding(model, num_shards=len(servers))
        try:
            with PSClient(
                list(servers),
                binding.layout,
                name=f"export-{socket.gethostname()}-{os.getpid()}",
                observer=True,
                config=ClientConfig(tls=tls, auth_token=token),
            ) as client:
                client.pull(binding.params)
                clock = client.clock
        except grpc.RpcError as error:
            raise server_failure(error, servers) from None
        except ServerMismatchError as error:
            raise click.ClickException(str(error)) from None
        tensors = named_tensors(binding.layout, binding.params)
        click.echo(f"pulled clock {clock}")
    kind = save_state_dict(tensors, out)
    total = sum(t.numel() for t in tensors.values())
    click.echo(f"wrote {out} ({kind}, {len(tensors)} tensors, {total} parameters)")


main.add_command(simulate_command)

if __name__ == "__main__":
    main()
