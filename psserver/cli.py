"""``psserver``: serve a shard, list the update rules, show a server's status."""

from __future__ import annotations

import logging
import os
import socket
import sys

import click
import grpc
import torch
from rich.console import Console
from rich.table import Table

from psproto.v1 import ps_pb2, ps_pb2_grpc
from psserver.core.consistency import Consistency, ConsistencyModel
from psserver.core.rules import RULES, RuleOptionError, RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psserver.metrics import DEFAULT_METRICS_PORT, ShardMetrics, serve_metrics
from psserver.rpc.latency import LatencyInterceptor
from psserver.rpc.server import serve_until_signalled, start_reaper, start_server, stop_on_signals
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


@click.group()
def main() -> None:
    """hetps parameter server."""


@main.command()
@click.option("--host", default="0.0.0.0", show_default=True, help="address to bind")
@click.option("--port", default=50051, show_default=True, type=click.IntRange(0, 65535), help="0 picks a free port")
@click.option("--rule", "rule_name", default="asgd", show_default=True, help="update rule (see `psserver rules`)")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=None, help="learning rate of the rule")
@click.option("--rule-opt", "rule_opts", multiple=True, metavar="KEY=VALUE", help="a rule option; repeatable")
@click.option("--shard-index", default=0, show_default=True, type=click.IntRange(min=0))
@click.option("--num-shards", default=1, show_default=True, type=click.IntRange(min=1))
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
) -> None:
    """Serve one shard of a model's parameters over gRPC until SIGTERM."""
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if shard_index_from_hostname:
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
        ),
        observer=metrics,
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
    try:
        interceptors = [LatencyInterceptor(metrics)] if metrics is not None else []
        running = start_server(shard, f"{host}:{port}", max_workers=threads, interceptors=interceptors)
    except (OSError, RuntimeError) as error:
        raise click.ClickException(f"cannot listen on {host}:{port}: {error}") from None
    stop = stop_on_signals()
    options = ", ".join(f"{k}={v}" for k, v in spec.options.as_strings().items())
    # The launcher and tests read the bound port from this line.
    click.echo(
        f"psserver listening on {host}:{running.port} rule={spec.rule.name} ({options}) "
        f"consistency={consistency} shard={shard_index}/{num_shards} pid={os.getpid()} "
        f"metrics={metrics_server.port if metrics_server else 'off'}",
        err=False,
    )
    sys.stdout.flush()
    reaper = start_reaper(shard, max(0.05, lease_seconds / 4))
    serve_until_signalled(running, drain_seconds, stop)
    reaper.set()
    if metrics_server is not None:
        metrics_server.close()
    # Every RPC has finished or been cancelled by now. Skipping interpreter teardown avoids a
    # race in gRPC's C++ core, whose threads can abort the process ("terminate called
    # without an active exception") while static objects are destroyed.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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
def status(server: str, timeout: float) -> None:
    """Show a running shard's clock, rule and workers."""
    with grpc.insecure_channel(server) as channel:
        try:
            reply: ps_pb2.StatusResponse = ps_pb2_grpc.ParameterServerStub(channel).Status(
                ps_pb2.StatusRequest(), timeout=timeout
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


@main.command()
@click.option("--server", "servers", required=True, multiple=True, help="HOST:PORT of a shard; repeat for every shard")
@click.option("--interval", default=1.0, show_default=True, type=click.FloatRange(min=0.1), help="seconds per refresh")
@click.option("--once", is_flag=True, help="print one snapshot and exit instead of refreshing")
def top(servers: tuple[str, ...], interval: float, once: bool) -> None:
    """Live view of running shards: workers' speed, staleness, gap, penalty; clock rate; rejections."""
    run_top(servers, interval, once)


if __name__ == "__main__":
    main()
