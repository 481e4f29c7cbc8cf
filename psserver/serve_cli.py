"""``psserver serve``: map the command's flags into a ``ServerConfig``, run the ``ServerApp`` until
SIGTERM or SIGINT, drain, and exit.

Flag combinations and texts are checked here (errors name the flag, exit 2); the application
checks files, checkpoints and ports, and its typed errors are mapped back to the flag they came
from. The ``psserver listening on ...`` line is for people; programs pass ``--ready-file``.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import click
from click.core import ParameterSource

from psproto import codec
from psproto.cli_options import CHUNK_SIZE_HELP, parse_chunk_size, path_option
from psserver.allocator import (
    DEFAULT_ARENAS,
    DEFAULT_MMAP_MIB,
    MAX_ARENAS,
    MAX_MMAP_MIB,
    arenas_in_effect,
    map_large_buffers,
)
from psserver.app import (
    BindError,
    CheckpointConfig,
    CheckpointRestoreError,
    MetricsBindError,
    MetricsConfig,
    SecurityConfig,
    SecurityFilesError,
    ServerApp,
    ServerConfig,
    ServerConfigError,
    ShardLimits,
)
from psserver.core.consistency import Consistency, ConsistencyModel
from psserver.core.pull_hold import consistency_refusal
from psserver.flags import parse_checkpoint_every, parse_receive_window, parse_rule
from psserver.metrics import DEFAULT_METRICS_PORT
from psserver.rpc.security import ServerTls
from psserver.rpc.server import DEFAULT_RECEIVE_WINDOW_BYTES, ServerLimits
from psserver.sharding import shard_index_from_hostname as shard_index_from_ordinal

_LOGGER = logging.getLogger("psserver")
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@click.command()
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
    "--chunk-size",
    default=None,
    help=f"pulled parameters: the {CHUNK_SIZE_HELP} "
    f"[default: {codec.DEFAULT_CHUNK_BYTES // 1024**2}MiB, or half of --max-message-mb if smaller]",
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
    "--max-receiving-pushes",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="pushes open at once, each holding its stream's transport buffers while it waits for a receive "
    "buffer; one more is refused at its header and its worker retries it (bounds memory; 0: no cap)",
)
@click.option(
    "--pull-versions",
    default=2,
    show_default=True,
    type=click.IntRange(min=1),
    help="serialised parameter versions (each the shard's size) being sent at once per reply form; at the "
    "limit an async pull gets the newest of them, whose clock tells the worker its staleness (bounds memory)",
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
    "--min-transfer-rate",
    default=0.1,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True),
    help="MiB/s that a push holding a receive buffer, an Init upload and a pull reply must average after "
    "--transfer-grace-seconds, or it is ended (a push: PUSH_STALLED, retried; a worker whose push was ended "
    "sits out 8 graces) and what it held is freed: a push of N MiB holds a buffer at most grace + N / rate "
    "seconds. Keep it far below the slowest worker's link",
)
@click.option(
    "--transfer-grace-seconds",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="seconds for a push's (or Init's, or pull reply's) first bytes before --min-transfer-rate applies",
)
@click.option(
    "--receive-window",
    default=str(DEFAULT_RECEIVE_WINDOW_BYTES),
    show_default=True,
    help="HTTP/2 flow-control window per stream in bytes (or 1MiB, 4MiB...), or 'auto' to let gRPC size it; "
    "a push waiting for a receive buffer holds up to this much in the server's memory",
)
@click.option(
    "--malloc-mmap-mib",
    default=DEFAULT_MMAP_MIB,
    show_default=True,
    type=click.IntRange(0, MAX_MMAP_MIB),
    help="allocations of at least this many MiB (shard-sized buffers: snapshots, copies, uploads) are mapped "
    "on their own and given back to the system when freed, instead of staying in the heap; 0 keeps the "
    "process's allocator settings (psserver/allocator.py)",
)
@click.option(
    "--malloc-arenas",
    default=DEFAULT_ARENAS,
    show_default=True,
    type=click.IntRange(1, MAX_ARENAS),
    help="glibc malloc arenas of the server process (MALLOC_ARENA_MAX, set by the psserver entry point when the "
    "process starts, replacing an inherited value); memory freed in one arena does not serve the others, so "
    "each one more can keep its own high-water mark of reply and request bytes (psserver/allocator.py)",
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
    chunk_size: str | None,
    max_concurrent_rpcs: int,
    max_streams_per_connection: int,
    max_workers: int,
    max_parameters: int,
    receive_buffers: int,
    max_receiving_pushes: int,
    pull_versions: int,
    receive_idle_seconds: float,
    min_transfer_rate: float,
    transfer_grace_seconds: float,
    receive_window: str,
    malloc_mmap_mib: int,
    malloc_arenas: int,
    ready_file: Path | None,
) -> None:
    """Serve one shard of a model's parameters over gRPC until SIGTERM."""
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    every_updates, every_seconds = parse_checkpoint_every(checkpoint_every)
    receive_window_bytes = parse_receive_window(receive_window)
    chunk_bytes = None if chunk_size is None else parse_chunk_size(chunk_size, max_message_mb * 1024 * 1024)
    if (tls_cert is None) != (tls_key is None):
        raise click.BadParameter("give both --tls-cert and --tls-key, or neither", param_hint="--tls-cert/--tls-key")
    if tls_client_ca is not None and tls_cert is None:
        raise click.BadParameter(
            "mutual TLS needs the server's own --tls-cert and --tls-key", param_hint="--tls-client-ca"
        )
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
    rule = parse_rule(rule_name, lr, rule_opts)
    refusal = consistency_refusal(rule.options, ConsistencyModel(consistency))
    if refusal is not None:
        raise click.BadParameter(refusal, param_hint="--consistency")
    config = ServerConfig(
        rule=rule,
        host=host,
        port=port,
        shard_index=shard_index,
        num_shards=num_shards,
        lease_seconds=lease_seconds,
        consistency=Consistency(ConsistencyModel(consistency), ssp_bound),
        threads=threads,
        torch_threads=torch_threads,
        drain_seconds=drain_seconds,
        transport=ServerLimits(
            max_message_mb * 1024 * 1024,
            max_concurrent_rpcs,
            max_streams_per_connection,
            receive_window_bytes,
            chunk_bytes,
        ),
        limits=ShardLimits(
            max_workers=max_workers,
            max_parameters=max_parameters,
            receive_buffers=receive_buffers,
            max_receiving_pushes=max_receiving_pushes,
            receive_idle_seconds=receive_idle_seconds,
            min_transfer_mib_per_s=min_transfer_rate,
            transfer_grace_seconds=transfer_grace_seconds,
            snapshot_memory_bytes=snapshot_memory_mb * 1024 * 1024,
            pull_versions=pull_versions,
        ),
        security=SecurityConfig(
            tls=ServerTls(tls_cert, tls_key, tls_client_ca) if tls_cert is not None and tls_key is not None else None,
            auth_token_file=auth_token_file,
        ),
        metrics=None if no_metrics else MetricsConfig(port=metrics_port),
        checkpoints=(
            None
            if checkpoint_dir is None
            else CheckpointConfig(checkpoint_dir, checkpoint_keep, every_updates, every_seconds)
        ),
        ready_file=ready_file,
    )
    map_large_buffers(malloc_mmap_mib)
    in_effect = arenas_in_effect(os.environ)
    if in_effect != malloc_arenas:
        # Started without the psserver entry point (python -c, an embedding), or with tuning off.
        logging.getLogger(__name__).warning(
            "--malloc-arenas %d is not in effect: this process started with MALLOC_ARENA_MAX=%s "
            "(the psserver entry point sets it when the process starts)",
            malloc_arenas,
            "unset" if in_effect is None else in_effect,
        )
    run(config)


# How often the main thread wakes to run pending signal handlers while it serves.
_SIGNAL_POLL_S = 0.5


def run(config: ServerConfig) -> None:
    """Build and start the server, serve until SIGTERM or SIGINT, drain, stop and end the process (exit 0)."""
    try:
        # Entering the app starts it; leaving it (however) drains, checkpoints and stops it.
        with stop_requested_by_signals() as stop, ServerApp.build(config) as app:
            click.echo(listening_line(app))
            sys.stdout.flush()
            # Waking now and then lets the main thread run a signal handler whose signal the kernel
            # delivered to another thread (gRPC's): an untimed wait would never see it.
            while not stop.wait(_SIGNAL_POLL_S):
                pass
    except ServerConfigError as error:
        raise click.UsageError(str(error)) from None
    except SecurityFilesError as error:
        raise click.UsageError(str(error)) from None
    except CheckpointRestoreError as error:
        raise click.BadParameter(str(error), param_hint="--checkpoint-dir") from None
    except MetricsBindError as error:
        raise click.ClickException(f"{error} (choose --metrics-port, or --no-metrics)") from None
    except BindError as error:
        raise click.ClickException(str(error)) from None
    # Every RPC has finished or been cancelled by now. Skipping interpreter teardown avoids a
    # race in gRPC's C++ core, whose threads can abort the process ("terminate called
    # without an active exception") while static objects are destroyed.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@contextmanager
def stop_requested_by_signals() -> Iterator[threading.Event]:
    """SIGTERM and SIGINT set the event instead of ending the process; installed before the server
    is announced, so none is lost, and the previous handlers are back on the way out."""
    stop = threading.Event()

    def request_stop(signum: int, frame: FrameType | None) -> None:
        _LOGGER.info("received %s, draining", signal.Signals(signum).name)
        stop.set()

    previous = {signum: signal.getsignal(signum) for signum in _STOP_SIGNALS}
    for signum in _STOP_SIGNALS:
        signal.signal(signum, request_stop)
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def listening_line(app: ServerApp) -> str:
    """The start-up line for people: where the server listens and what it serves."""
    config = app.config
    options = ", ".join(f"{k}={v}" for k, v in config.rule.options.as_strings().items())
    tls = config.security.tls
    tls_mode = "off" if tls is None else "mutual" if tls.client_ca is not None else "on"
    return (
        f"psserver listening on {config.host}:{app.port} rule={config.rule.rule.name} ({options}) "
        f"consistency={config.consistency.model.value} shard={config.shard_index}/{config.num_shards} "
        f"pid={os.getpid()} tls={tls_mode} auth={'token' if app.auth_token else 'off'} clock={app.shard.clock} "
        f"metrics={app.metrics_port if app.metrics_port is not None else 'off'}"
    )
