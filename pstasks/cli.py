"""``psworker``: the worker's command group and ``psworker train`` (train a task against a running server).

It lives beside the built-in tasks because it finds a task by name (:func:`pstasks.tasks.load_task`);
the ``psworker`` console script adds the tools' commands (``cluster``, ``simulate``, ``export``)
from :mod:`pstools.cli`. This module imports nothing of the server."""

from __future__ import annotations

import json
import signal
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

import click
import grpc
import torch

from pscli.config_file import ConfigFileError, merged, read_toml
from pscli.help_sections import SectionedCommand
from psproto.security import SecurityConfigError
from pstasks.idx import IdxError
from pstasks.run_config import WorkerRunConfig, with_security_files_read, worker_run_config
from pstasks.task_error import TaskError
from pstasks.tasks import load_task
from psworker.cli_options import (
    auth_token_option,
    config_option,
    flag_table,
    tls_ca_option,
    wire_dtype_options,
)
from psworker.client import ServerMismatchError
from psworker.procedures import ProcedureError
from psworker.train import train


def _exit_on_signal(signum: int, frame: FrameType | None) -> NoReturn:
    raise SystemExit(128 + signum)


def server_failure(error: grpc.RpcError, servers: tuple[str, ...]) -> click.ClickException:
    """A failed call as one line; "refused" only when a server answered."""
    code = error.code()
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return click.ClickException(
            f"no answer from {', '.join(servers)} ({code.name}: {error.details()}); check the --server "
            "addresses and that every shard is running"
        )
    return click.ClickException(f"server refused: {code.name}: {error.details()}")


class DataFileError(click.ClickException):
    """A task's data file missing or malformed: one line, exit 2 like any other bad input."""

    exit_code = 2


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """``INDEX/COUNT`` (``2/4``: the third of four disjoint parts) for --shard-data."""
    if text is None:
        return None
    index_text, sep, count_text = text.partition("/")
    try:
        index, count = int(index_text), int(count_text)
    except ValueError:
        index = count = -1
    if not sep or count < 1 or not 0 <= index < count:
        raise click.BadParameter(
            f"{text!r}: give INDEX/COUNT with 0 <= INDEX < COUNT, e.g. 0/4", param_hint="--shard-data"
        )
    return index, count


# The task and its data folder, as every command that builds a task takes them (psworker train, cluster, simulate).
task_option = click.option(
    "--task",
    default="digits",
    show_default=True,
    help="built-in task (digits, fashion, fashion-resnet18, tinylm, gpt2-small) or module:function",
)
data_dir_option = click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="directory of the task's data files (default: $HETPS_DATA_DIR, else /usr/share/datasets/fashion-mnist)",
)


@click.group()
def main() -> None:
    """hetps worker."""


# Where each flag of `psworker train` goes in its configuration file (pstasks.run_config).
TRAIN_FLAG_KEYS: dict[str, tuple[str, ...]] = {
    "servers": ("train", "servers"),
    "task": ("task",),
    "data_dir": ("data_dir",),
    "shard_data": ("train", "shard_data"),
    "name": ("train", "name"),
    "device": ("train", "device"),
    "slowdown": ("train", "slowdown"),
    "max_steps": ("train", "max_steps"),
    "max_seconds": ("train", "max_seconds"),
    "until_clock": ("train", "until_clock"),
    "wire_dtype": ("train", "client", "wire_dtype"),
    "push_dtype": ("train", "client", "push_dtype"),
    "log_file": ("train", "log_file"),
    "tls_ca": ("train", "client", "tls", "ca"),
    "auth_token_file": ("auth_token_file",),
}
TRAIN_SECTIONS = {
    "Servers": ("servers", "tls_ca", "auth_token_file"),
    "Task & data": ("task", "data_dir", "shard_data"),
    "Worker": ("name", "device", "slowdown", "wire_dtype", "push_dtype"),
    "Stopping (default: --until-clock 1000)": ("max_steps", "max_seconds", "until_clock"),
    "Output & configuration": ("log_file", "config_file"),
}


@main.command("train", cls=SectionedCommand, sections=TRAIN_SECTIONS)
@click.option(
    "--server",
    "servers",
    multiple=True,
    help="HOST:PORT of a shard, or its replicas as HOST:PORT|HOST:PORT (the primary is found); repeat once per "
    "shard, in shard order",
)
@tls_ca_option
@auth_token_option
@task_option
@data_dir_option
@click.option(
    "--shard-data",
    default=None,
    metavar="INDEX/COUNT",
    callback=lambda ctx, param, value: parse_shard(value),
    help="train on part INDEX of COUNT disjoint parts of the training set (default: all of it)",
)
@click.option("--name", default=None, help="unique worker name (default: host and process)")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda or cuda:N")
@click.option(
    "--slowdown",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=1.0),
    help="run X times slower, to emulate a slower GPU",
)
@wire_dtype_options
@click.option("--max-steps", type=click.IntRange(min=1), default=None, help="stop after this many local steps")
@click.option(
    "--max-seconds",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="stop after this many seconds of training",
)
@click.option(
    "--until-clock",
    type=click.IntRange(min=1),
    default=None,
    help="stop once the server has applied this many updates",
)
@click.option("--log-file", type=click.Path(dir_okay=False, path_type=Path), default=None, help="JSON-lines log")
@config_option()
@click.pass_context
def train_command(ctx: click.Context, /, config_file: Path | None, **flags: Any) -> None:
    """Train a task against a running server.

    Every other setting (step time, evaluation, seed, pull dtype, chunk size, retries, keepalive,
    deadlines, mutual TLS, threads...) is a key of the --config file: docs/configuration.md."""
    # SIGTERM (a pod being stopped) unwinds like Ctrl-C: the client leaves every shard, so no
    # record of this worker is left for a barrier to wait on, or its replacement to wait out.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    config = read_run_config(ctx, config_file, flags)
    torch.set_num_threads(config.torch_threads)
    try:
        loaded = load_task(config.task, config.data_dir, config.task_options)
        if config.train.shard_data is not None:
            loaded = loaded.shard(*config.train.shard_data)
    except TaskError as error:
        raise click.BadParameter(str(error), param_hint="--task") from None
    except IdxError as error:
        raise DataFileError(str(error)) from None
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--shard-data") from None
    try:
        summary = train(config.train, loaded)
    except grpc.RpcError as error:
        raise server_failure(error, config.train.servers) from None
    except (ProcedureError, ServerMismatchError, ValueError) as error:
        raise click.ClickException(str(error)) from None
    click.echo(json.dumps(asdict(summary)))


def read_run_config(ctx: click.Context, config_file: Path | None, flags: Mapping[str, Any]) -> WorkerRunConfig:
    """The file's settings with the flags given over them, the TLS files checked and the token read;
    a usage error (exit 2) names the key or flag to fix."""
    where = f"--config {config_file}: " if config_file is not None else ""
    try:
        table = merged(
            read_toml(config_file) if config_file is not None else {}, flag_table(ctx, flags, TRAIN_FLAG_KEYS)
        )
        train_table = table.get("train")
        if not isinstance(train_table, dict) or "servers" not in train_table:
            raise ConfigFileError("give --server HOST:PORT (once per shard), or servers in the [train] table")
        config = worker_run_config(table)
    except ConfigFileError as error:
        raise click.UsageError(f"{where}{error}") from None
    try:
        return with_security_files_read(config)
    except SecurityConfigError as error:
        raise click.UsageError(str(error)) from None


if __name__ == "__main__":
    main()
