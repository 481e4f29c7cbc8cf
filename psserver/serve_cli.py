"""``psserver serve``: read the configuration file (``--config``), put the flags given over it, check
the whole ``ServerConfig`` once, run the ``ServerApp`` until SIGTERM or SIGINT, drain, and exit.

The flags are what a user decides (rule, shard, consistency, checkpoints, security, ports); every
other setting lives in the file, with automatic defaults (docs/configuration.md). A key, type or
value that cannot be used exits 2 naming it; the application's typed errors map to the flag they
came from. The ``psserver listening on ...`` line is for people; programs pass ``--ready-file``.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

import click
from click.core import ParameterSource

from pscli.config_file import ConfigFileError, Converters, build, merged, read_toml
from pscli.help_sections import SectionedCommand
from psproto import codec
from psserver.allocator import apply_allocator
from psserver.app import (
    BindError,
    CheckpointRestoreError,
    MetricsBindError,
    SecurityFilesError,
    ServerApp,
    ServerConfig,
    ServerConfigError,
)
from psserver.core.consistency import ConsistencyModel
from psserver.core.rules import RULES, RuleOptionError, RuleSpec
from psserver.flags import METRICS_OFF, MetricsPort, parse_checkpoint_every, parse_rule_options
from psserver.metrics import DEFAULT_METRICS_PORT
from psserver.rpc.server import ServerLimits
from psserver.sharding import shard_index_from_hostname as shard_index_from_ordinal

_LOGGER = logging.getLogger("psserver")
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
DEFAULT_RULE = "asgd"


def _rule_spec(value: Any, key: str) -> RuleSpec:
    """``[shard.rule]``: ``name`` and the rule's options (``lr`` among them) as keys beside it."""
    if not isinstance(value, dict):
        raise ConfigFileError(f"{key} must be a table with a name and the rule's options, not {value!r}")
    options = dict(value)
    name = options.pop("name", DEFAULT_RULE)
    if name not in RULES:
        raise ConfigFileError(f"{key}.name {name!r} is not a rule; choose one of {', '.join(sorted(RULES))}")
    raw = {option: str(v).lower() if isinstance(v, bool) else str(v) for option, v in options.items()}
    try:
        return RuleSpec.parse(name, raw)
    except RuleOptionError as error:
        raise ConfigFileError(f"{key}: {error} (see `psserver rules`)") from None


CONVERTERS: Converters = {RuleSpec: _rule_spec}


def server_config(table: Mapping[str, Any]) -> ServerConfig:
    """The ``ServerConfig`` of a configuration table (a file's, with flags put over it); a
    ``ConfigFileError`` names the key that cannot be used."""
    table = merged({"shard": {"rule": {}}}, table)
    transport = table.get("transport")
    if isinstance(transport, dict) and "max_message_bytes" in transport and "chunk_bytes" not in table["shard"]:
        # A smaller message limit halves the default chunk, so a chunk and its header always fit.
        limit = build(ServerLimits, transport, where="transport.").max_message_bytes
        table = merged(table, {"shard": {"chunk_bytes": min(codec.DEFAULT_CHUNK_BYTES, limit // 2)}})
    return build(ServerConfig, table, CONVERTERS)


def _flag_table(ctx: click.Context, flags: Mapping[str, Any], file_rule: Mapping[str, Any]) -> dict[str, Any]:
    """The configuration keys of the flags given on the command line (to put over the file's)."""
    given = {
        name: value for name, value in flags.items() if ctx.get_parameter_source(name) is not ParameterSource.DEFAULT
    }
    table: dict[str, Any] = {key: _str_path(given[key]) for key in ("host", "port", "ready_file") if key in given}
    sections = {
        "shard": _shard_keys(given, file_rule),
        "security": _security_keys(given),
        "checkpoints": _checkpoint_keys(given),
        "replication": _replication_keys(given),
    }
    table.update({section: keys for section, keys in sections.items() if keys})
    if given.get("metrics_port") == METRICS_OFF:
        table["metrics"] = False
    elif "metrics_port" in given:
        table["metrics"] = {"port": given["metrics_port"]}
    return table


# The keys a flag also sets, so a refusal of one names the flag too.
_FLAG_OF_KEY = {
    "security.tls.cert": "--tls-cert",
    "security.tls.key": "--tls-key",
    "security.tls.client_ca": "--tls-client-ca",
    "shard.shard_index": "--shard-index",
    "shard.num_shards": "--num-shards",
    "replication.etcd": "--etcd",
    "replication.job": "--etcd",
}


def _flags_named(message: str) -> str:
    """ " (flag --x)" for each key of ``message`` that a flag sets; empty when none does."""
    flags = [flag for key, flag in _FLAG_OF_KEY.items() if key in message]
    return f" (on the command line: {', '.join(flags)})" if flags else ""


def _str_path(value: Any) -> Any:
    """A path flag as the file's string; any other value as it is."""
    return str(value) if isinstance(value, Path) else value


def rule_over_file(rule: Mapping[str, Any], file_rule: Mapping[str, Any]) -> dict[str, Any]:
    """A ``[shard.rule]`` given over a file's: the same rule keeps the file's options under the
    ones given; another rule takes none of them."""
    same = rule.get("name", file_rule.get("name", DEFAULT_RULE)) == file_rule.get("name", DEFAULT_RULE)
    return merged(file_rule, rule) if same else dict(rule)


def _shard_keys(given: Mapping[str, Any], file_rule: Mapping[str, Any]) -> dict[str, Any]:
    """``[shard]`` of the flags: the rule, the shard's place, the consistency model."""
    shard: dict[str, Any] = {key: given[key] for key in ("shard_index", "num_shards") if key in given}
    rule: dict[str, Any] = {key: given[flag] for flag, key in (("rule_name", "name"), ("lr", "lr")) if flag in given}
    rule.update(parse_rule_options(given.get("rule_opts", ())))
    if rule:
        shard["rule"] = rule_over_file(rule, file_rule)
    consistency = {
        key: given[flag] for flag, key in (("consistency", "model"), ("ssp_bound", "staleness_bound")) if flag in given
    }
    if consistency:
        shard["consistency"] = consistency
    return shard


def _security_keys(given: Mapping[str, Any]) -> dict[str, Any]:
    """``[security]`` of the flags: TLS files and the token file."""
    tls = {key: str(given[f"tls_{key}"]) for key in ("cert", "key", "client_ca") if f"tls_{key}" in given}
    security: dict[str, Any] = {"tls": tls} if tls else {}
    if "auth_token_file" in given:
        security["auth_token_file"] = str(given["auth_token_file"])
    return security


def _replication_keys(given: Mapping[str, Any]) -> dict[str, Any]:
    """``[replication]`` of the flags: etcd's endpoints, the job, the advertised address."""
    if not given.get("etcd"):
        return {}
    endpoints, jobs = [], set()
    for url in given["etcd"]:
        parts = urlsplit(url)
        endpoints.append(f"{parts.scheme}://{parts.netloc}")
        jobs.add(parts.path.strip("/"))
    if len(jobs) > 1:
        raise click.BadParameter(f"the endpoints name different jobs: {', '.join(sorted(jobs))}", param_hint="--etcd")
    (job,) = jobs
    return {"etcd": endpoints, **({"job": job} if job else {})}


def _checkpoint_keys(given: Mapping[str, Any]) -> dict[str, Any]:
    """``[checkpoints]`` of the flags: where, and how often."""
    checkpoints: dict[str, Any] = {}
    if "checkpoint_dir" in given:
        checkpoints["directory"] = str(given["checkpoint_dir"])
    if "checkpoint_every" in given:
        checkpoints["every_updates"], checkpoints["every_seconds"] = parse_checkpoint_every(given["checkpoint_every"])
    return checkpoints


SECTIONS = {
    "Model & rule": ("rule_name", "lr", "rule_opts", "consistency", "ssp_bound"),
    "Cluster": ("host", "port", "shard_index", "num_shards", "shard_index_from_hostname"),
    "Checkpoints": ("checkpoint_dir", "checkpoint_every"),
    "Replication": ("etcd",),
    "Security": ("tls_cert", "tls_key", "tls_client_ca", "auth_token_file"),
    "Observability": ("metrics_port", "ready_file"),
    "Configuration": ("config_file",),
}
_FILE = click.Path(exists=True, dir_okay=False, readable=True, path_type=Path)


@click.command(cls=SectionedCommand, sections=SECTIONS)
@click.option("--rule", "rule_name", default=DEFAULT_RULE, show_default=True, help="update rule (see `psserver rules`)")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=None, help="learning rate of the rule")
@click.option("--rule-opt", "rule_opts", multiple=True, metavar="KEY=VALUE", help="a rule option; repeatable")
@click.option(
    "--consistency",
    default="async",
    show_default=True,
    type=click.Choice([m.value for m in ConsistencyModel]),
    help="async, ssp (bounded staleness) or bsp (bulk synchronous), in front of the rule",
)
@click.option("--ssp-bound", default=3, show_default=True, type=click.IntRange(min=0), help="SSP's bound s")
@click.option("--host", default="0.0.0.0", show_default=True, help="address to bind")
@click.option("--port", default=50051, show_default=True, type=click.IntRange(0, 65535), help="0 picks a free port")
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
@click.option(
    "--etcd",
    multiple=True,
    metavar="URL",
    help="serve this shard as one replica of a replica set whose primary etcd elects: http(s)://HOST:PORT/JOB "
    "(JOB names the training job, default hetps; repeatable: each endpoint of the etcd cluster); replicas "
    "reach each other at --host:--port (docs/operations.md, Replicated shards; etcd over TLS: "
    "[replication.etcd_tls] in --config)",
)
@click.option(
    "--tls-cert", type=_FILE, default=None, help="PEM certificate chain of this server (turns TLS on; needs --tls-key)"
)
@click.option("--tls-key", type=_FILE, default=None, help="PEM private key of --tls-cert")
@click.option(
    "--tls-client-ca",
    type=_FILE,
    default=None,
    help="require client certificates signed by this CA (mutual TLS; needs --tls-cert)",
)
@click.option(
    "--auth-token-file",
    type=_FILE,
    default=None,
    help="require 'authorization: Bearer <token>' on every RPC but health",
)
@click.option(
    "--metrics-port",
    default=None,
    type=MetricsPort(),
    help=f"Prometheus scrape port on --host [default: {DEFAULT_METRICS_PORT} + shard index]; 0 picks a free port, "
    "off serves none",
)
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="once serving, write the bound address, port, pid and metrics port here as JSON (psserver/ready.py)",
)
@click.option(
    "--config",
    "config_file",
    type=_FILE,
    default=None,
    help="TOML file of every setting (docs/configuration.md): limits, transport, metrics, allocator...; "
    "a flag given here overrides the file",
)
@click.pass_context
def serve(ctx: click.Context, /, config_file: Path | None, shard_index_from_hostname: bool, **flags: Any) -> None:
    """Serve one shard of a model's parameters over gRPC until SIGTERM."""
    try:
        table = read_toml(config_file) if config_file is not None else {}
        file_rule = table.get("shard", {}).get("rule", {}) if isinstance(table.get("shard"), dict) else {}
        over = _flag_table(ctx, flags, file_rule if isinstance(file_rule, dict) else {})
        if "rule" in over.get("shard", {}) and isinstance(table.get("shard"), dict):
            # The flags' rule table already holds what it keeps of the file's.
            table = {**table, "shard": {k: v for k, v in table["shard"].items() if k != "rule"}}
        table = merged(table, over)
        if shard_index_from_hostname:
            table = merged(table, {"shard": {"shard_index": _ordinal(ctx, table)}})
        config = server_config(table)
    except ConfigFileError as error:
        where = f"--config {config_file}: " if config_file is not None else ""
        raise click.UsageError(f"{where}{error}{_flags_named(str(error))}") from None
    logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    apply_allocator(config.allocator)
    run(config)


def _ordinal(ctx: click.Context, table: Mapping[str, Any]) -> int:
    """The shard index of this pod's hostname (its StatefulSet ordinal)."""
    if ctx.get_parameter_source("shard_index") is not ParameterSource.DEFAULT:
        raise click.UsageError("give --shard-index or --shard-index-from-hostname, not both")
    hostname = os.environ.get("HOSTNAME") or socket.gethostname()
    shards = table.get("shard", {}).get("num_shards", 1)
    try:
        return shard_index_from_ordinal(hostname, shards)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--shard-index-from-hostname") from None


# The exit status of a primary replica that stepped down (its lease ran out, another took over).
EXIT_DEPOSED = 75
# How often the main thread wakes to run pending signal handlers while it serves.
_SIGNAL_POLL_S = 0.5


def run(config: ServerConfig) -> None:
    """Build and start the server, serve until SIGTERM or SIGINT, drain, stop and end the process (exit 0;
    ``EXIT_DEPOSED`` when a primary replica stepped down)."""
    try:
        # Entering the app starts it; leaving it (however) drains, checkpoints and stops it.
        with stop_requested_by_signals() as stop, ServerApp.build(config) as app:
            click.echo(listening_line(app))
            sys.stdout.flush()
            # Waking now and then lets the main thread run a signal handler whose signal the kernel
            # delivered to another thread (gRPC's): an untimed wait would never see it.
            while not stop.wait(_SIGNAL_POLL_S) and not app.deposed.is_set():
                pass
            deposed = app.deposed.is_set()
    except ServerConfigError as error:
        raise click.UsageError(str(error)) from None
    except SecurityFilesError as error:
        raise click.UsageError(str(error)) from None
    except CheckpointRestoreError as error:
        raise click.BadParameter(str(error), param_hint="--checkpoint-dir") from None
    except MetricsBindError as error:
        raise click.ClickException(f"{error} (choose another --metrics-port, or --metrics-port off)") from None
    except BindError as error:
        raise click.ClickException(str(error)) from None
    # Every RPC has finished or been cancelled by now. Skipping interpreter teardown avoids a
    # race in gRPC's C++ core, whose threads can abort the process ("terminate called
    # without an active exception") while static objects are destroyed.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # A replica that stepped down ends with EX_TEMPFAIL: restarted, it comes back as a backup.
    os._exit(EXIT_DEPOSED if deposed else 0)


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
    shard = config.shard
    options = ", ".join(f"{k}={v}" for k, v in shard.rule.options.as_strings().items())
    tls = config.security.tls
    tls_mode = "off" if tls is None else "mutual" if tls.client_ca is not None else "on"
    return (
        f"psserver listening on {config.host}:{app.port} rule={shard.rule.rule.name} ({options}) "
        f"consistency={shard.consistency.model.value} shard={shard.shard_index}/{shard.num_shards} "
        f"pid={os.getpid()} tls={tls_mode} auth={'token' if app.auth_token else 'off'} clock={app.shard.clock} "
        f"metrics={app.metrics_port if app.metrics_port is not None else 'off'}"
    )
