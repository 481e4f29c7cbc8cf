"""``psserver rules``, ``status``, ``checkpoint`` and ``top``: the commands that describe the rules
or talk to running shards (``serve`` is in ``psserver.serve_cli``)."""

from __future__ import annotations

from pathlib import Path

import click
import grpc
from rich.console import Console
from rich.table import Table

from psproto import security
from psproto.cli_options import client_security_from_flags, client_security_options
from psproto.security import bearer_metadata
from psproto.v1 import ps_pb2, ps_pb2_grpc
from psserver.core.rules import RULES
from psserver.top import run_top


def open_channel(
    server: str, tls_ca: Path | None, tls_cert: Path | None, tls_key: Path | None, auth_token_file: Path | None
) -> tuple[grpc.Channel, tuple[tuple[str, str], ...]]:
    """A channel to ``server`` with the given TLS files, and the metadata carrying the token."""
    tls, token = client_security_from_flags(tls_ca, tls_cert, tls_key, auth_token_file)
    return security.open_channel(server, tls), bearer_metadata(token)


@click.command()
def rules() -> None:
    """List every update rule with its options, defaults and when to use it."""
    console = Console()
    for name in sorted(RULES):
        rule = RULES[name]
        table = Table(title=f"{name} — {rule.summary}", title_justify="left", show_edge=False)
        table.add_column("option")
        table.add_column("type")
        table.add_column("default")
        table.add_column("meaning")
        for row in rule.options_type.describe():
            table.add_row(*row)
        console.print(table)
        kinds = ", ".join(k.name.lower() for k in sorted(rule.accepted_kinds))
        console.print(f"  worker procedure: {rule.worker_procedure}; accepts: {kinds}\n")


@click.command()
@click.option("--server", required=True, help="HOST:PORT of a shard")
@click.option("--timeout", default=5.0, show_default=True, type=float)
@client_security_options
def status(
    server: str,
    timeout: float,
    tls_ca: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    auth_token_file: Path | None,
) -> None:
    """Show a running shard's clock, rule and workers."""
    channel, metadata = open_channel(server, tls_ca, tls_cert, tls_key, auth_token_file)
    with channel:
        try:
            reply: ps_pb2.StatusResponse = ps_pb2_grpc.ParameterServerStub(channel).Status(
                ps_pb2.StatusRequest(), timeout=timeout, metadata=metadata
            )
        except grpc.RpcError as error:
            raise click.ClickException(f"{server}: {error.code().name}: {error.details()}") from None
    console = Console()
    console.print(
        f"shard {reply.shard_index}/{reply.num_shards}  clock {reply.clock}  rule {reply.rule.name}  "
        f"applied {reply.applied_pushes}  rejected {dict(reply.rejected)}"
    )
    table = Table("worker", "name", "pushes", "pulls", "staleness mean", "max", "seen (s ago)")
    for w in reply.workers:
        table.add_row(
            str(w.worker_id),
            w.worker_name,
            str(w.pushes),
            str(w.pulls),
            f"{w.mean_staleness:.2f}",
            str(w.max_staleness),
            f"{w.seconds_since_seen:.1f}",
        )
    console.print(table)


@click.command("checkpoint")
@click.option("--server", required=True, help="HOST:PORT of a shard")
@click.option("--timeout", default=120.0, show_default=True, type=float)
@client_security_options
def checkpoint_command(
    server: str,
    timeout: float,
    tls_ca: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    auth_token_file: Path | None,
) -> None:
    """Make a running shard write a checkpoint now; prints the file and its clock."""
    channel, metadata = open_channel(server, tls_ca, tls_cert, tls_key, auth_token_file)
    with channel:
        try:
            reply: ps_pb2.CheckpointResponse = ps_pb2_grpc.ParameterServerStub(channel).Checkpoint(
                ps_pb2.CheckpointRequest(), timeout=timeout, metadata=metadata
            )
        except grpc.RpcError as error:
            raise click.ClickException(f"{server}: {error.code().name}: {error.details()}") from None
    click.echo(f"{reply.path} clock={reply.clock}")


@click.command()
@click.option("--server", "servers", required=True, multiple=True, help="HOST:PORT of a shard; repeat for every shard")
@click.option("--interval", default=1.0, show_default=True, type=click.FloatRange(min=0.1), help="seconds per refresh")
@click.option(
    "--once", is_flag=True, help="print one snapshot and exit instead of refreshing (exit 1 if a shard did not answer)"
)
@client_security_options
def top(
    servers: tuple[str, ...],
    interval: float,
    once: bool,
    tls_ca: Path | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    auth_token_file: Path | None,
) -> None:
    """Live view of running shards: workers' speed, staleness, gap, penalty; clock rate; rejections."""
    tls, token = client_security_from_flags(tls_ca, tls_cert, tls_key, auth_token_file)
    errors = run_top(servers, interval, once, tls=tls, auth_token=token)
    if once and errors:
        raise click.ClickException("no answer from " + "; ".join(errors))
