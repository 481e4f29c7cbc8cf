"""``psserver rules``, ``status``, ``checkpoint``, ``checkpoints`` and ``top``: the commands that
describe the rules, talk to running shards or check a checkpoint folder (``serve`` is in
``psserver.serve_cli``)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
import grpc
from rich.console import Console
from rich.table import Table

from psproto import security
from psproto.security import bearer_metadata
from psproto.v1 import ps_pb2, ps_pb2_grpc
from psserver.top import ShardView, backups_table, human_size, run_top

if TYPE_CHECKING:
    from psserver.core.checkpoint import FileReport


_FILE = click.Path(exists=True, dir_okay=False, readable=True, path_type=Path)
_CommandT = TypeVar("_CommandT", bound=Callable[..., Any])


def client_security_options(command: _CommandT) -> _CommandT:
    """--tls-ca, --tls-cert, --tls-key, --auth-token-file of the commands that call a server."""
    options = (
        click.option("--tls-ca", type=_FILE, help="CA certificate that signed the server's certificate (turns TLS on)"),
        click.option("--tls-cert", type=_FILE, help="this client's certificate, for a server that requires mutual TLS"),
        click.option("--tls-key", type=_FILE, help="the private key of --tls-cert"),
        click.option("--auth-token-file", type=_FILE, help="file holding the server's bearer token"),
    )
    for option in reversed(options):
        command = option(command)
    return command


def client_security_from_flags(
    tls_ca: Path | None, tls_cert: Path | None, tls_key: Path | None, auth_token_file: Path | None
) -> tuple[security.ClientTls | None, str | None]:
    """Validated TLS files and token from the options above; a usage error (exit 2) says what to fix."""
    try:
        return security.client_security(tls_ca, tls_cert, tls_key, auth_token_file)
    except security.SecurityConfigError as error:
        raise click.UsageError(str(error)) from None


def open_channel(
    server: str, tls_ca: Path | None, tls_cert: Path | None, tls_key: Path | None, auth_token_file: Path | None
) -> tuple[grpc.Channel, tuple[tuple[str, str], ...]]:
    """A channel to ``server`` with the given TLS files, and the metadata carrying the token."""
    tls, token = client_security_from_flags(tls_ca, tls_cert, tls_key, auth_token_file)
    return security.open_channel(server, tls), bearer_metadata(token)


@click.command()
def rules() -> None:
    """List every update rule with its options, defaults and when to use it."""
    from psserver.core.rules import RULES  # torch: imported by the commands that need it only

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


ReplyT = TypeVar("ReplyT")
_Security = tuple[Path | None, Path | None, Path | None, Path | None]


def _ask_shard(
    server: str,
    security: _Security,
    call: Callable[[ps_pb2_grpc.ParameterServerStub, tuple[tuple[str, str], ...]], ReplyT],
) -> ReplyT:
    """One call to a shard over a channel opened and closed here; a failure is a one-line CLI error."""
    channel, metadata = open_channel(server, *security)
    with channel:
        try:
            return call(ps_pb2_grpc.ParameterServerStub(channel), metadata)
        except grpc.RpcError as error:
            raise click.ClickException(f"{server}: {error.code().name}: {error.details()}") from None


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
    """Show a running shard's clock, rule and workers; a replica's standing, and a primary's backups."""
    reply: ps_pb2.StatusResponse = _ask_shard(
        server,
        (tls_ca, tls_cert, tls_key, auth_token_file),
        lambda stub, metadata: stub.Status(ps_pb2.StatusRequest(), timeout=timeout, metadata=metadata),
    )
    console = Console()
    console.print(
        f"shard {reply.shard_index}/{reply.num_shards}  clock {reply.clock}  rule {reply.rule.name}  "
        f"applied {reply.applied_pushes}  rejected {dict(reply.rejected)}"
    )
    if reply.HasField("replica"):
        r = reply.replica
        console.print(
            f"replica {r.name}  {r.role}  epoch {r.epoch}  primary {r.primary or 'none'}  "
            f"in sync {'yes' if r.in_sync else 'no'}  version {r.version}  holds clock {r.clock}  "
            f"failovers {r.failovers}  digest mismatches {r.digest_mismatches}",
            highlight=False,
            soft_wrap=True,
        )
        backups = backups_table([ShardView(server, reply)], console.width)
        if backups is not None:
            console.print(backups)
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
    reply: ps_pb2.CheckpointResponse = _ask_shard(
        server,
        (tls_ca, tls_cert, tls_key, auth_token_file),
        lambda stub, metadata: stub.Checkpoint(ps_pb2.CheckpointRequest(), timeout=timeout, metadata=metadata),
    )
    click.echo(f"{reply.path} clock={reply.clock}")


def _age(seconds: float) -> str:
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m {whole % 60}s"
    if whole < 86400:
        return f"{whole // 3600}h {whole % 3600 // 60}m"
    return f"{whole // 86400}d {whole % 86400 // 3600}h"


def _as_json(report: FileReport, now: float) -> dict[str, Any]:
    return {
        "file": report.path.name,
        "path": str(report.path),
        "sequence": report.sequence,
        "clock": report.clock,
        "size": report.size,
        "modified": report.modified,
        "age_seconds": round(now - report.modified, 3),
        "status": report.verdict.status,
        "problem": report.verdict.problem,
    }


@click.command("checkpoints")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="print one JSON object instead of a table")
def checkpoints_command(directory: Path, as_json: bool) -> None:
    """Check every checkpoint in DIRECTORY (a --checkpoint-dir): clock, size, age, ok or damaged.

    Each file's checksum is read in full. Exit 0 when the newest is intact (or there is none),
    1 when the newest is damaged (a start restores the newest intact one before it, or refuses
    when there is none), 2 when DIRECTORY does not exist or is not a directory."""
    from psserver.core.checkpoint import inspect_directory, temporaries

    reports = inspect_directory(directory)
    leftovers = temporaries(directory)
    now = time.time()
    newest_damaged = bool(reports) and reports[-1].verdict.status == "damaged"
    intact = [r for r in reports if r.verdict.status != "damaged"]
    restores = intact[-1] if intact else None
    if as_json:
        document = {
            "directory": str(directory),
            "checkpoints": [_as_json(r, now) for r in reports],
            "newest_damaged": newest_damaged,
            "restores": None if restores is None else str(restores.path),
            "temporaries": [str(p) for p in leftovers],
        }
        click.echo(json.dumps(document, indent=1))
    else:
        _print_checkpoints(directory, reports, leftovers, restores, now)
    sys.exit(1 if newest_damaged else 0)


def _print_checkpoints(
    directory: Path, reports: list[FileReport], leftovers: list[Path], restores: FileReport | None, now: float
) -> None:
    console = Console()
    if not reports:
        console.print(f"no checkpoints (ckpt-*.pt) in {directory}", soft_wrap=True)
    else:
        table = Table(title=str(directory), title_justify="left")
        table.add_column("file", no_wrap=True)
        table.add_column("clock", justify="right")
        table.add_column("size", justify="right")
        table.add_column("age", justify="right")
        table.add_column("state")
        for report in reports:
            verdict = report.verdict
            state = {
                "ok": "[green]ok[/]",
                "unverified": "[yellow]unverified[/] (no checksum: written before checksums)",
            }.get(verdict.status, f"[red]damaged[/]: {verdict.problem}")
            table.add_row(
                report.path.name, str(report.clock), human_size(report.size), _age(now - report.modified), state
            )
        console.print(table)
        if reports[-1].verdict.status == "damaged":
            then = f"restores {restores.path.name} (clock {restores.clock})" if restores else "is refused"
            console.print(f"[red]the newest checkpoint is damaged[/]: a start {then}", highlight=False, soft_wrap=True)
    if leftovers:
        names = ", ".join(p.name for p in leftovers)
        console.print(
            f"{len(leftovers)} half-written temporary file(s), removed on the next start: {names}", soft_wrap=True
        )


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
