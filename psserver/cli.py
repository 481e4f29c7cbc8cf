"""``psserver``: serve a shard, list the update rules, show a server's status."""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
from pathlib import Path

import click
import grpc
import torch
from click.core import ParameterSource
from rich.console import Console
from rich.table import Table

from psproto import codec, security
from psproto.cli_options import client_security_from_flags, client_security_options, path_option
from psproto.security import SecurityConfigError, bearer_metadata, read_token_file
from psproto.v1 import ps_pb2, ps_pb2_grpc
from psserver.core import checkpoint
from psserver.core.consistency import Consistency, ConsistencyModel
from psserver.core.rules import RULES, RuleOptionError, RuleSpec
from psserver.core.shard import Shard, ShardConfig, StateError
from psserver.metrics import DEFAULT_METRICS_PORT, ShardMetrics, serve_metrics
from psserver.ready import ReadyInfo, write_ready_file
from psserver.rpc.latency import LatencyInterceptor
from psserver.rpc.security import AuthInterceptor, ServerTls
from psserver.rpc.server import (
    DEFAULT_RECEIVE_WINDOW_BYTES,
    MAX_RECEIVE_WINDOW_BYTES,
    MIN_RECEIVE_WINDOW_BYTES,
    ServerLimits,
    serve_until_signalled,
    start_reaper,
    start_server,
    stop_on_signals,
)
from psserver.sharding import shard_index_from_hostname as shard_index_from_ordinal
from psserver.top import run_top


def _parse_rule_options(pairs: tuple[str, ...]) -> dict[str, str]:
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not key=value", param_hint="--rule-opt")
        options[key.strip()] = value.strip()
    return options


def parse_rule(name: str, lr: float | None, pairs: tuple[str, ...]) -> RuleSpec:
    """Validated rule choice from CLI flags; errors name what is valid."""
    raw = _parse_rule_options(pairs)
    if lr is not None:
        raw["lr"] = repr(lr)
    try:
        return RuleSpec.parse(name, raw)
    except RuleOptionError as error:
        hint = "--rule" if name not in RULES else "--rule-opt"
        raise click.BadParameter(f"{error} (see `psserver rules`)", param_hint=hint) from None


_EVERY = re.compile(r"^\s*(\d+)\s*(s|sec|seconds?|u|updates?)?\s*$")


def parse_checkpoint_every(text: str) -> tuple[int, float]:
    """``500`` (updates), ``30s`` (seconds) or both, comma-separated: (updates, seconds)."""
    updates, seconds = 0, 0.0
    for part in text.split(","):
        match = _EVERY.match(part)
        if not match or int(match.group(1)) == 0:
            raise click.BadParameter(
                f"{text!r}: give a positive number of updates (500), seconds (30s), or both (500,30s)",
                param_hint="--checkpoint-every",
            )
        if (match.group(2) or "u").startswith("s"):
            seconds = float(match.group(1))
        else:
            updates = int(match.group(1))
    return updates, seconds


_SIZE = re.compile(r"^\s*(\d+)\s*(b|kib|mib|gib)?\s*$", re.IGNORECASE | re.ASCII)
_SIZE_UNITS = {"b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3}


def parse_receive_window(text: str) -> int | None:
    """``auto`` (None: gRPC probes the link) or a whole number of bytes, KiB, MiB or GiB (``4MiB``)."""
    if text.strip().lower() == "auto":
        return None
    match = _SIZE.match(text)
    if match is None:
        raise click.BadParameter(
            f"{text!r}: give 'auto' or a whole number of bytes, KiB, MiB or GiB (e.g. 4MiB)",
            param_hint="--receive-window",
        )
    size = int(match.group(1)) * _SIZE_UNITS[(match.group(2) or "b").lower()]
    if not MIN_RECEIVE_WINDOW_BYTES <= size <= MAX_RECEIVE_WINDOW_BYTES:
        raise click.BadParameter(
            f"{text!r} is {size} bytes; a window is 64KiB ({MIN_RECEIVE_WINDOW_BYTES}) to "
            f"{MAX_RECEIVE_WINDOW_BYTES} bytes (HTTP/2's largest)",
            param_hint="--receive-window",
        )
    return size


def open_channel(
    server: str, tls_ca: Path | None, tls_cert: Path | None, tls_key: Path | None, auth_token_file: Path | None
) -> tuple[grpc.Channel, tuple[tuple[str, str], ...]]:
    """A channel to ``server`` with the given TLS files, and the metadata carrying the token."""
    tls, token = client_security_from_flags(tls_ca, tls_cert, tls_key, auth_token_file)
    return security.open_channel(server, tls), bearer_metadata(token)


@click.group()
def main() -> None:
    """hetps parameter server."""


@main.command()
@click.option("--host", default="0.0.0.0", show_default=True, help="address to bind")
@click.option("--port", default=50051, show_default=True, type=click.IntRange(0, 65535), help="0 picks a free port")
@click.option("--rule", "rule_name", default="asgd", show_default=True, help="update rule (see `psserver rules`)")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=None, help="learning rate of the rule")
@click.option("--rule-opt", "rule_opts", multiple=True, metavar="KEY=VALUE", help="a rule option; repeatable")
@click.option(
    "--shard-index",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="which shard of the model this server holds, 0 to --num-shards - 1",
)
@click.option(
    "--num-shards",
    default=1,
    show_default=True,
    type=click.IntRange(min=1),
    help="how many servers the model is split over; every server and worker must say the same",
)
@click.option(
    "--shard-index-from-hostname",
    is_flag=True,
    help="take the shard index from the '-N' suffix of the hostname (a StatefulSet pod's ordinal)",
)
@click.option("--lease-seconds", default=30.0, show_default=True, type=click.FloatRange(min=0, min_open=True))
@click.option(
    "--consistency",
    default="async",
    show_default=True,
    type=click.Choice([m.value for m in ConsistencyModel]),
    help="async, ssp (bounded staleness) or bsp (bulk synchronous), in front of the rule",
)
@click.option("--ssp-bound", default=3, show_default=True, type=click.IntRange(min=0), help="SSP's bound s")
@click.option(
    "--snapshot-memory-mb",
    default=2048,
    show_default=True,
    type=click.IntRange(min=1),
    help="cap on parameter versions kept for gap-measuring rules (GA, DC-ASGD)",
)
@click.option(
    "--threads",
    default=128,
    show_default=True,
    type=click.IntRange(min=1),
    help="RPC worker threads; under ssp/bsp waiting requests hold one each, so keep it above the worker count",
)
@click.option("--torch-threads", default=2, show_default=True, type=click.IntRange(min=1), help="threads for updates")
@click.option("--drain-seconds", default=10.0, show_default=True, type=click.FloatRange(min=0))
@click.option(
    "--metrics-port",
    default=None,
    type=click.IntRange(0, 65535),
    help=f"Prometheus scrape port on --host [default: {DEFAULT_METRICS_PORT} + shard index]; 0 picks a free port",
)
@click.option("--no-metrics", is_flag=True, help="serve no Prometheus metrics")
@click.option(
    "--log-level", default="INFO", show_default=True, type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"])
)
@click.option(
    "--checkpoint-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="write checkpoints here, and restore the newest one on start",
)
@click.option(
    "--checkpoint-every",
    default="1000",
    show_default=True,
    help="updates (500), seconds (30s), or both (500,30s) between checkpoints",
)
@click.option("--checkpoint-keep", default=3, show_default=True, type=click.IntRange(min=1), help="checkpoints kept")
@path_option("--tls-cert", "PEM certificate chain of this server (turns TLS on; needs --tls-key)")
@path_option("--tls-key", "PEM private key of --tls-cert")
@path_option("--tls-client-ca", "require client certificates signed by this CA (mutual TLS; needs --tls-cert)")
@path_option("--auth-token-file", "require 'authorization: Bearer <token>' on every RPC but health")
@click.option(
    "--max-message-mb", default=64, show_default=True, type=click.IntRange(1, 2047), help="largest gRPC message"
)
@click.option(
    "--max-concurrent-rpcs",
    default=1024,
    show_default=True,
    type=click.IntRange(min=1),
    help="RPCs in progress or queued at once; more are refused with RESOURCE_EXHAUSTED",
)
@click.option(
    "--max-streams-per-connection", default=256, show_default=True, type=click.IntRange(min=1), help="per client"
)
@click.option(
    "--max-workers",
    default=1024,
    show_default=True,
    type=click.IntRange(min=1),
    help="workers and observers joined at once; more Joins are refused with RESOURCE_EXHAUSTED",
)
@click.option(
    "--max-parameters",
    default=2**31,
    show_default=True,
    type=click.IntRange(min=1),
    help="parameters this shard may hold; a larger model's Join is refused with RESOURCE_EXHAUSTED",
)
@click.option(
    "--receive-buffers",
    default=2,
    show_default=True,
    type=click.IntRange(min=1),
    help="pushes decoded at once, each into a buffer of the shard's size; more wait (bounds memory)",
)
@click.option(
    "--receive-idle-seconds",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=0.1),
    help="a push holding a receive buffer that sends nothing for this long is cancelled (its worker sees "
    "CANCELLED), so a stalled client cannot keep the buffer from the others",
)
@click.option(
    "--receive-window",
    default=str(DEFAULT_RECEIVE_WINDOW_BYTES),
    show_default=True,
    help="HTTP/2 flow-control window per stream in bytes (or 1MiB, 4MiB...), or 'auto' to let gRPC size it; "
    "a push waiting for a receive buffer holds up to this much in the server's memory",
)
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="once serving, write the bound address, port, pid and metrics port here as JSON (psserver/ready.py)",
)
def serve(
    host: str,
    port: int,
    rule_name: str,
    lr: float | None,
    rule_opts: tuple[str, ...],
    shard_index: int,
    num_shards: int,
    shard_index_from_hostname: bool,
    lease_seconds: float,
    consistency: str,
    ssp_bound: int,
    snapshot_memory_mb: int,
    threads: int,
    torch_threads: int,
    drain_seconds: float,
    metrics_port: int | None,
    no_metrics: bool,
    log_level: str,
    checkpoint_dir: Path | None,
    checkpoint_every: str,
    checkpoint_keep: int,
    tls_cert: Path | None,
    tls_key: Path | None,
    tls_client_ca: Path | None,
    auth_token_file: Path | None,
    max_message_mb: int,
    max_concurrent_rpcs: int,
    max_streams_per_connection: int,
    max_workers: int,
    max_parameters: int,
    receive_buffers: int,
    receive_idle_seconds: float,
    receive_window: str,
    ready_file: Path | None,
) -> None:
    """Serve one shard of a model's parameters over gRPC until SIGTERM."""
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("psserver")
    every_updates, every_seconds = parse_checkpoint_every(checkpoint_every)
    receive_window_bytes = parse_receive_window(receive_window)
    if (tls_cert is None) != (tls_key is None):
        raise click.BadParameter("give both --tls-cert and --tls-key, or neither", param_hint="--tls-cert/--tls-key")
    if tls_client_ca is not None and tls_cert is None:
        raise click.BadParameter(
            "mutual TLS needs the server's own --tls-cert and --tls-key", param_hint="--tls-client-ca"
        )
    tls = ServerTls(tls_cert, tls_key, tls_client_ca) if tls_cert is not None and tls_key is not None else None
    try:
        token = read_token_file(auth_token_file) if auth_token_file is not None else None
        if tls is not None:
            tls.credentials()  # fail now, with the flag's name, rather than at bind time
    except SecurityConfigError as error:
        raise click.UsageError(str(error)) from None
    if shard_index_from_hostname:
        if click.get_current_context().get_parameter_source("shard_index") is not ParameterSource.DEFAULT:
            raise click.UsageError("give --shard-index or --shard-index-from-hostname, not both")
        hostname = os.environ.get("HOSTNAME") or socket.gethostname()
        try:
            shard_index = shard_index_from_ordinal(hostname, num_shards)
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="--shard-index-from-hostname") from None
    if shard_index >= num_shards:
        raise click.BadParameter(f"must be below --num-shards ({num_shards})", param_hint="--shard-index")
    spec = parse_rule(rule_name, lr, rule_opts)
    torch.set_num_threads(torch_threads)
    metrics = None
    if not no_metrics:
        info = {"rule": spec.rule.name, "consistency": consistency, "num_shards": str(num_shards)}
        metrics = ShardMetrics(shard_index, info, process_metrics=True)
    shard = Shard(
        ShardConfig(
            spec,
            shard_index=shard_index,
            num_shards=num_shards,
            lease_seconds=lease_seconds,
            consistency=Consistency(ConsistencyModel(consistency), ssp_bound),
            snapshot_memory_bytes=snapshot_memory_mb * 1024 * 1024,
            max_workers=max_workers,
            max_parameters=max_parameters,
            receive_buffers=receive_buffers,
            receive_idle_seconds=receive_idle_seconds,
            # Pulled chunks plus their headers must fit under --max-message-mb, or Pull fails.
            chunk_bytes=min(codec.DEFAULT_CHUNK_BYTES, max_message_mb * 1024 * 1024 // 2),
        ),
        observer=metrics,
    )
    checkpointer = None
    if checkpoint_dir is not None:
        try:
            restored = checkpoint.restore(shard, checkpoint_dir, metrics)
        except (checkpoint.CheckpointError, StateError) as error:
            raise click.BadParameter(str(error), param_hint="--checkpoint-dir") from None
        if restored is not None:
            log.info(
                "restored checkpoint %s: clock %d, %d worker(s)", restored, shard.clock, len(shard.worker_snapshot())
            )
        checkpointer = checkpoint.Checkpointer(
            shard, checkpoint_dir, checkpoint_keep, every_updates, every_seconds, observer=metrics
        )
    metrics_server = None
    if metrics is not None:
        scrape_port = DEFAULT_METRICS_PORT + shard_index if metrics_port is None else metrics_port
        try:
            metrics_server = serve_metrics(metrics.registry, host, scrape_port)
        except OSError as error:
            raise click.ClickException(
                f"cannot serve metrics on {host}:{scrape_port}: {error} (choose --metrics-port, or --no-metrics)"
            ) from None
        logging.getLogger("psserver").info("Prometheus metrics at http://%s:%d/metrics", host, metrics_server.port)
    interceptors: list[LatencyInterceptor | AuthInterceptor] = []
    if metrics is not None:
        interceptors.append(LatencyInterceptor(metrics))
    if token is not None:
        # Counted in Status and the metrics like the shard's own refusals.
        interceptors.append(AuthInterceptor(token, lambda _method: shard.count_rejected("unauthenticated")))
    limits = ServerLimits(
        max_message_mb * 1024 * 1024, max_concurrent_rpcs, max_streams_per_connection, receive_window_bytes
    )
    try:
        running = start_server(
            shard,
            f"{host}:{port}",
            max_workers=threads,
            interceptors=interceptors,
            tls=tls,
            limits=limits,
            checkpointer=checkpointer,
        )
    except (OSError, RuntimeError) as error:
        raise click.ClickException(f"cannot listen on {host}:{port}: {error}") from None
    if checkpointer is not None:
        checkpointer.start()
    stop = stop_on_signals()
    options = ", ".join(f"{k}={v}" for k, v in spec.options.as_strings().items())
    # The launcher and tests read the bound port from this line.
    click.echo(
        f"psserver listening on {host}:{running.port} rule={spec.rule.name} ({options}) "
        f"consistency={consistency} shard={shard_index}/{num_shards} pid={os.getpid()} "
        f"tls={_tls_mode(tls)} auth={'token' if token else 'off'} clock={shard.clock} "
        f"metrics={metrics_server.port if metrics_server else 'off'}",
        err=False,
    )
    sys.stdout.flush()
    if ready_file is not None:
        write_ready_file(
            ready_file,
            ReadyInfo(
                host=host,
                port=running.port,
                pid=os.getpid(),
                shard_index=shard_index,
                num_shards=num_shards,
                rule=spec.rule.name,
                clock=shard.clock,
                metrics_port=metrics_server.port if metrics_server else None,
            ),
        )
    reaper = start_reaper(shard, max(0.05, min(lease_seconds, receive_idle_seconds) / 4))
    serve_until_signalled(running, drain_seconds, stop)
    reaper.set()
    if checkpointer is not None:
        # Every push has finished or was cancelled: the last checkpoint holds all acknowledged ones.
        checkpointer.stop()
        try:
            written = checkpointer.write_now()
            log.info("final checkpoint %s (clock %d)", written.path, written.clock)
        except checkpoint.CheckpointError as error:
            log.error("final checkpoint failed: %s", error)
    if metrics_server is not None:
        metrics_server.close()
    # Every RPC has finished or been cancelled by now. Skipping interpreter teardown avoids a
    # race in gRPC's C++ core, whose threads can abort the process ("terminate called
    # without an active exception") while static objects are destroyed.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _tls_mode(tls: ServerTls | None) -> str:
    if tls is None:
        return "off"
    return "mutual" if tls.client_ca is not None else "on"


@main.command()
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


@main.command()
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


@main.command("checkpoint")
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


@main.command()
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


if __name__ == "__main__":
    main()
