"""``psworker``: the worker's command group and ``psworker train`` (train a task against a running server).

It lives beside the built-in tasks because it finds a task by name (:func:`pstasks.tasks.load_task`);
the ``psworker`` console script adds the tools' commands (``cluster``, ``simulate``, ``export``)
from :mod:`pstools.cli`. This module imports nothing of the server."""

from __future__ import annotations

import json
import signal
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import NoReturn

import click
import grpc
import torch

from pstasks.idx import IdxError
from pstasks.task_error import TaskError
from pstasks.tasks import load_task
from psworker.channels import DEFAULT_KEEPALIVE_S, MIN_KEEPALIVE_S
from psworker.cli_options import client_security_from_flags, client_security_options, wire_dtype_options
from psworker.client import DeadlinePolicy, ServerMismatchError
from psworker.procedures import ProcedureError
from psworker.train import ENCODE_PLACES, TrainConfig, train


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


# The task's data folder, as every command that builds a task takes it (psworker train, cluster, simulate).
data_dir_option = click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="directory of the task's data files (default: $HETPS_DATA_DIR, else /usr/share/datasets/fashion-mnist)",
)


@click.group()
def main() -> None:
    """hetps worker."""


@main.command("train")
@click.option(
    "--server",
    "servers",
    multiple=True,
    required=True,
    help="HOST:PORT of a shard; repeat once per shard, in shard order",
)
@click.option(
    "--task",
    default="digits",
    show_default=True,
    help="built-in task (digits, fashion, fashion-resnet18, tinylm) or module:function",
)
@data_dir_option
@click.option(
    "--shard-data",
    default=None,
    metavar="INDEX/COUNT",
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
@click.option(
    "--step-time",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="seconds of a full-speed step: every step lasts slowdown × this (an emulated device of fixed speed); "
    "default: the slowdown scales the measured compute time",
)
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
    help="stop once the server has applied this many updates (default 1000 without --max-steps or --max-seconds)",
)
@click.option("--eval-every", default=200, show_default=True, type=click.IntRange(min=0), help="0 disables")
@click.option("--seed", default=0, show_default=True, type=int)
@wire_dtype_options
@click.option("--log-file", type=click.Path(dir_okay=False, path_type=Path), default=None, help="JSON-lines log")
@click.option("--progress/--no-progress", default=True, show_default=True)
@click.option("--torch-threads", default=1, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--retry-seconds",
    default=300.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="keep retrying (with backoff) a server that is down or unreachable this long before giving up",
)
@click.option(
    "--keepalive-seconds",
    default=DEFAULT_KEEPALIVE_S,
    show_default=True,
    type=click.FloatRange(min=MIN_KEEPALIVE_S),
    help="ping each server this often over HTTP/2; a link that went silent is noticed within 1.5 times this",
)
@click.option(
    "--min-transfer-rate",
    default=DeadlinePolicy.min_bytes_per_second / 2**20,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="MiB/s a call's payload is given in its deadline (on top of a fixed allowance); lower it for slow links",
)
@click.option(
    "--encode-on",
    type=click.Choice(ENCODE_PLACES),
    default="device",
    show_default=True,
    help="where a GPU worker encodes int8 pushes: on the GPU (only the 8-bit values cross to the host) "
    "or on the host CPU after the fp32 gradients cross",
)
@client_security_options
def train_command(
    servers: tuple[str, ...],
    task: str,
    data_dir: Path | None,
    shard_data: str | None,
    name: str | None,
    device: str,
    slowdown: float,
    step_time: float | None,
    max_steps: int | None,
    max_seconds: float | None,
    until_clock: int | None,
    eval_every: int,
    seed: int,
    wire_dtype: str,
    push_dtype: str | None,
    pull_dtype: str | None,
    chunk_size: int,
    error_feedback: bool,
    log_file: Path | None,
    progress: bool,
    torch_threads: int,
    retry_seconds: float,
    keepalive_seconds: float,
    min_transfer_rate: float,
    encode_on: str,
    tls_ca: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    auth_token_file: Path | None,
) -> None:
    """Train a task against a running server."""
    # SIGTERM (a pod being stopped) unwinds like Ctrl-C: the client leaves every shard, so no
    # record of this worker is left for a barrier to wait on, or its replacement to wait out.
    signal.signal(signal.SIGTERM, _exit_on_signal)
    torch.set_num_threads(torch_threads)
    tls, token = client_security_from_flags(tls_ca, tls_cert, tls_key, auth_token_file)
    if max_steps is None and until_clock is None and max_seconds is None:
        until_clock = 1000
    shard = parse_shard(shard_data)
    try:
        loaded = load_task(task, data_dir)
        if shard is not None:
            loaded = loaded.shard(*shard)
    except TaskError as error:
        raise click.BadParameter(str(error), param_hint="--task") from None
    except IdxError as error:
        raise DataFileError(str(error)) from None
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--shard-data") from None
    config = TrainConfig(
        list(servers),
        task,
        name,
        device,
        slowdown,
        max_steps,
        until_clock,
        eval_every,
        seed,
        wire_dtype,
        log_file,
        progress,
        tls=tls,
        auth_token=token,
        retry_seconds=retry_seconds,
        keepalive_seconds=keepalive_seconds,
        min_transfer_bytes_per_second=min_transfer_rate * 2**20,
        data_dir=data_dir,
        shard_data=shard,
        max_seconds=max_seconds,
        step_seconds=step_time,
        push_dtype=push_dtype,
        pull_dtype=pull_dtype,
        error_feedback=error_feedback,
        chunk_bytes=chunk_size,
        encode_on=encode_on,
    )
    try:
        summary = train(config, loaded)
    except grpc.RpcError as error:
        raise server_failure(error, servers) from None
    except (ProcedureError, ServerMismatchError, ValueError) as error:
        raise click.ClickException(str(error)) from None
    click.echo(json.dumps(asdict(summary)))


if __name__ == "__main__":
    main()
