"""The tools' commands of ``psworker``: ``cluster``, ``export`` and ``simulate``, added to psworker's group.

They run both sides on one machine (or read the server's checkpoints), so they live here and
not in :mod:`pstasks.cli`; :data:`main` is psworker's click group with them added, which the
``psworker`` console script runs (:mod:`pstools.entry`).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import click
import grpc
from rich.console import Console
from rich.table import Table

from pscli.config_file import ConfigFileError, build, merged, read_toml
from pscli.help_sections import SectionedCommand
from pstasks.cli import DataFileError, data_dir_option, main, server_failure, task_option
from pstasks.idx import IdxError
from pstasks.run_config import worker_run_config
from pstasks.task_error import TaskError
from pstasks.tasks import load_task
from pstools.export import ExportError, named_tensors, save_state_dict, state_dict_from_checkpoints
from pstools.launcher import ClusterConfig, ClusterError, ClusterReport, run_cluster
from pstools.sim_cli import simulate_command
from psworker.binding import ModelBinding
from psworker.cli_options import (
    client_security_from_flags,
    client_security_options,
    config_option,
    flag_table,
    wire_dtype_options,
)
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


# Where each flag of `psworker cluster` goes in its configuration file (a [server] table for every
# shard, a [worker] table for every worker, the launcher's own keys at the top).
CLUSTER_FLAG_KEYS: dict[str, tuple[str, ...]] = {
    "consistency": ("server", "shard", "consistency", "model"),
    "wire_dtype": ("worker", "train", "client", "wire_dtype"),
    "push_dtype": ("worker", "train", "client", "push_dtype"),
    "device": ("worker", "train", "device"),
}
CLUSTER_SECTIONS = {
    "Workers": ("workers", "slowdowns", "device", "wire_dtype", "push_dtype"),
    "Model & rule": ("rule", "lr", "rule_opts", "consistency", "shards", "replicas"),
    "Task & data": ("task", "data_dir", "updates"),
    "Output & configuration": ("log_dir", "config_file"),
    "Where it runs": ("ray_address",),
}


@dataclass(frozen=True)
class ClusterSettings:
    """The top-level keys of `psworker cluster --config` (beside its [server] and [worker] tables)."""

    # Worker r's batch sampler is seeded with seed * 1000 + r.
    seed: int = 0
    # Give up when the workers have not finished after this many seconds.
    timeout_s: float = 600.0
    # Evaluate on the test set every this many steps in each worker (0: only at the end).
    eval_every: int = 0
    # Whether worker r trains on part r of as many disjoint parts of the training set as there are
    # workers; "auto": as the task says (the fashion tasks do, digits does not).
    shard_data: bool | None = None


def cluster_tables(table: Mapping[str, Any]) -> tuple[ClusterSettings, dict[str, Any], dict[str, Any]]:
    """The launcher's settings, the servers' table and the workers' table of a cluster file, each
    checked now (a ConfigFileError names the key) so that no process starts with a bad one."""
    from psserver.serve_cli import server_config  # the server's own reader; `psworker train` never needs it

    rest = {key: value for key, value in table.items() if key not in ("server", "worker")}
    tables = {key: table.get(key, {}) for key in ("server", "worker")}
    for key, value in tables.items():
        if not isinstance(value, dict):
            raise ConfigFileError(f"{key} must be a table, not {value!r}")
    server, worker = tables["server"], tables["worker"]
    chunk = worker.get("train", {}).get("client", {}).get("chunk_bytes")
    if chunk is not None and "chunk_bytes" not in server.get("shard", {}):
        # One chunk size both ways: the servers cut pulled parameters as the workers cut pushes.
        server = merged(server, {"shard": {"chunk_bytes": chunk}})
    server_config(merged(server, {"shard": {"rule": {}}}))
    worker_run_config(merged(worker, {"train": {"servers": ["127.0.0.1:1"]}}))
    return build(ClusterSettings, rest), server, worker


@main.command(cls=SectionedCommand, sections=CLUSTER_SECTIONS)
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
@task_option
@data_dir_option
@click.option(
    "--updates",
    default=1500,
    show_default=True,
    type=click.IntRange(min=1),
    help="train until the server has applied this many updates",
)
@click.option("--shards", default=1, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--replicas",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="servers per shard; from 2 on each shard is a replica set (a primary and backups that take over "
    "when it dies) elected in an etcd the cluster starts (Debian's etcd-server); a replica that exits is "
    "started again at its address and comes back as a backup",
)
@click.option(
    "--consistency",
    default="async",
    show_default=True,
    type=click.Choice(["async", "ssp", "bsp"]),
    help="consistency model in front of the rule (SSP's bound: shard.consistency.staleness_bound in [server])",
)
@wire_dtype_options
@click.option("--device", default="auto", show_default=True)
@click.option("--log-dir", default=Path("runs/latest"), show_default=True, type=click.Path(path_type=Path))
@click.option(
    "--ray",
    "ray_address",
    default=None,
    metavar="ADDRESS",
    help="run on the Ray cluster at ADDRESS (auto: the one this machine is in; ray://HOST:10001), "
    "the shards and workers as actors placed by the [ray] table's resources (docs/ray.md)",
)
@config_option(
    "TOML file: seed, timeout_s, eval_every and shard_data, a [server] table (`psserver serve --config` keys) for "
    "every shard, a [worker] table (`psworker train --config` keys) for every worker and, with --ray, "
    "a [ray] table (groups of workers, resources); flags override it"
)
@click.pass_context
def cluster(ctx: click.Context, /, config_file: Path | None, **flags: Any) -> None:
    """Run a server and WORKERS workers of different speeds on this machine, then report."""
    speeds = _parse_slowdowns(flags["slowdowns"])
    if len(speeds) != flags["workers"]:
        raise click.BadParameter(
            f"{len(speeds)} slowdown(s) for {flags['workers']} worker(s)", param_hint="--slowdowns"
        )
    # The local launcher runs the server too: check the rule with the server's own parser (and
    # its message) before starting anything. Imported here: `psworker train` never needs it.
    from psserver.flags import parse_rule

    parse_rule(flags["rule"], flags["lr"], flags["rule_opts"])
    where = f"--config {config_file}: " if config_file is not None else ""
    try:
        file_table = read_toml(config_file) if config_file is not None else {}
        ray_table = file_table.pop("ray", None)
        if isinstance(ray_table, dict) and "checkpoint_dir" in ray_table:
            # On Ray each shard's checkpoint folder is decided under [ray] checkpoint_dir.
            folder = {"server": {"checkpoints": {"directory": str(ray_table["checkpoint_dir"])}}}
            file_table = merged(file_table, folder)
        settings, server, worker = cluster_tables(merged(file_table, flag_table(ctx, flags, CLUSTER_FLAG_KEYS)))
    except ConfigFileError as error:
        raise click.UsageError(f"{where}{error}") from None
    if ray_table is not None and flags["ray_address"] is None:
        raise click.UsageError(f"{where}a [ray] table says where a job on Ray runs: give --ray ADDRESS too")
    if flags["replicas"] > 1 and flags["ray_address"] is not None:
        raise click.UsageError("--replicas is for the local cluster: on Ray, Ray restarts a shard that dies")
    config = ClusterConfig(
        flags["workers"],
        speeds,
        flags["rule"],
        flags["lr"],
        flags["rule_opts"],
        flags["task"],
        flags["updates"],
        flags["shards"],
        flags["replicas"],
        flags["wire_dtype"],
        flags["log_dir"],
        flags["device"],
        settings.seed,
        settings.eval_every,
        timeout_s=settings.timeout_s,
        server_config=server,
        data_dir=flags["data_dir"],
        shard_data=settings.shard_data,
        worker_config=worker,
    )
    if flags["ray_address"] is not None:
        _run_on_ray(config, flags["ray_address"], ray_table or {}, where)
        return
    console = Console()
    console.print(
        f"hetps local cluster: rule [bold]{config.rule}[/] ({flags['consistency']}), {config.workers} workers "
        f"(slowdowns {flags['slowdowns']}), {config.shards} shard(s)"
        f"{f' of {config.replicas} replicas' if config.replicas > 1 else ''}, {config.until_clock} updates, "
        f"logs in {config.log_dir}"
    )
    try:
        report = run_cluster(config)
    except ClusterError as error:
        raise click.ClickException(str(error)) from None
    except IdxError as error:
        raise DataFileError(str(error)) from None
    _print_report(console, report)


def _print_report(console: Console, report: ClusterReport) -> None:
    on_ray = bool(report.groups)
    columns = ["worker", "slowdown", "steps", "pushes", "staleness mean", "staleness max", "s/step"]
    table = Table(*columns, *(["group", "ended"] if on_ray else []))
    for w in report.workers:
        table.add_row(
            w.name,
            f"{w.slowdown:g}×",
            str(w.steps),
            str(w.pushes),
            f"{w.mean_staleness:.2f}",
            str(w.max_staleness),
            f"{w.compute_seconds_per_step * 1000:.1f} ms",
            *([w.group, w.state] if on_ray else []),
        )
    console.print(table)
    if on_ray:
        groups = Table("group", "workers", "finished", "lost", "steps", "pushes", "staleness mean", "staleness max")
        for g in report.groups:
            staleness = f"{g.mean_staleness:.2f}"
            groups.add_row(
                g.name, *map(str, (g.count, g.finished, g.lost, g.steps, g.pushes)), staleness, str(g.max_staleness)
            )
        console.print(groups)
        console.print(f"metrics: {', '.join(report.metrics_targets) or 'none'}")
    if on_ray or report.shard_restarts:
        console.print(f"shard restarts: {report.shard_restarts}")
    console.print(f"final {report.describe()} after {report.clock} updates in {report.wall_seconds:.1f} s")
    sys.stdout.flush()


def _run_on_ray(config: ClusterConfig, address: str, ray_table: Mapping[str, Any], where: str) -> None:
    """``psworker cluster --ray``: the same job, its shards and workers as actors on a Ray cluster."""
    if find_spec("ray") is None:
        click.echo("psworker cluster --ray needs the ray extra: pip install 'hetps[ray]'", err=True)
        sys.exit(2)
    from pstools.on_ray import RayJobConfig, RayJobError, run_job
    from pstools.on_ray.config import ray_settings

    try:
        job = RayJobConfig(config, ray_settings(ray_table))
    except ConfigFileError as error:
        raise click.UsageError(f"{where}{error}") from None
    console = Console()
    groups = ", ".join(f"{g.name} ×{g.count}" for g in job.worker_groups())
    console.print(
        f"hetps on Ray ({address}): rule [bold]{config.rule}[/], {config.shards} shard(s), groups {groups}, "
        f"{config.until_clock} updates, report in {config.log_dir}"
    )
    try:
        report = run_job(job, address)
    except RayJobError as error:
        raise click.ClickException(str(error)) from None
    except IdxError as error:
        raise DataFileError(str(error)) from None
    _print_report(console, report)


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
