"""The server application: a frozen ``ServerConfig`` in, a running shard server out.

``ServerApp.build(config)`` checks the configuration and builds the shard (restoring the newest
checkpoint), its metrics and checkpointer; ``start()`` binds the metrics endpoint and the gRPC
port, starts the lease reaper and the checkpointer, and writes the ready file; ``drain()`` and
``stop()`` take it down again, writing the final checkpoint. Used as a context manager it
starts on entry and stops on exit, so a test can serve a shard on port 0 in-process.

The application never installs signal handlers nor ends the process: ``psserver serve``
(``psserver.serve_cli``) maps its flags into a ``ServerConfig``, turns SIGTERM into ``drain``
and exits. Everything that can go wrong while building or starting raises a ``ServerAppError``
subclass, which the CLI maps to its exit codes and flag names.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import torch

from psproto.codec import chunk_bytes_problem
from psproto.security import SecurityConfigError, bearer_metadata, read_token_file
from psserver.allocator import AllocatorConfig
from psserver.core import checkpoint
from psserver.core.shard import Shard, ShardConfig, StateError
from psserver.metrics import DEFAULT_METRICS_PORT, DEFAULT_WORKER_SERIES, MetricsServer, ShardMetrics, serve_metrics
from psserver.ready import ReadyInfo, write_ready_file
from psserver.replication.backups import REPLICATION_CHUNK_BYTES, PeerAccess
from psserver.replication.config import ReplicationConfig
from psserver.replication.coordinator import Coordinator, EtcdError
from psserver.replication.node import NodeHooks, NodeParts, ReplicaNode
from psserver.replication.standby import add_replica_service
from psserver.rpc.latency import LatencyInterceptor
from psserver.rpc.security import AuthInterceptor, ServerTls
from psserver.rpc.server import ReplicaServing, RunningServer, ServerLimits, start_server

_LOGGER = logging.getLogger(__name__)


class ServerAppError(Exception):
    """The server could not be built or started; the message says why."""


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# A replica's first request to etcd: one that every endpoint was slow to answer (a busy host) is
# asked again for this long; an endpoint that refuses the connection or the certificate is not.
START_ETCD_PATIENCE_S = 10.0
START_ETCD_RETRY_S = 0.2


class ServerConfigError(ServerAppError, ValueError):
    """A ``ServerConfig`` value out of range."""


class SecurityFilesError(ServerAppError):
    """A TLS or token file that cannot be read or used; the message names the file and its flag."""


class CheckpointRestoreError(ServerAppError):
    """The checkpoint directory holds no readable checkpoint, or one of another rule or shard."""


class MetricsBindError(ServerAppError):
    """The Prometheus endpoint cannot listen on its address."""


class BindError(ServerAppError):
    """The gRPC server cannot listen on its address (port in use, address not local)."""


def _require(holds: bool, problem: str) -> None:
    if not holds:
        raise ServerConfigError(problem)


@dataclass(frozen=True)
class SecurityConfig:
    """TLS (mutual when ``tls.client_ca`` is set) and the bearer token every RPC but health must carry."""

    # TLS on (mutual with client_ca); false or left out: plaintext.
    tls: ServerTls | None = None
    # A file holding the token every RPC but health must carry as 'authorization: Bearer <token>'.
    auth_token_file: Path | None = None


@dataclass(frozen=True)
class CheckpointConfig:
    """Where checkpoints go (the newest is restored on build), how many are kept and how often."""

    # Checkpoints are written here, and the newest is restored on start.
    directory: Path
    # How many checkpoints are kept.
    keep: int = 3
    # Updates between checkpoints (0: not by updates).
    every_updates: int = 1000
    # Seconds between checkpoints (0: not by time).
    every_seconds: float = 0.0

    def __post_init__(self) -> None:
        _require(self.keep >= 1, f"keep at least 1 checkpoint, not {self.keep}")
        _require(self.every_updates >= 0 and self.every_seconds >= 0, f"negative checkpoint interval: {self}")


@dataclass(frozen=True)
class MetricsConfig:
    """The Prometheus scrape endpoint, served on the server's host."""

    # None: DEFAULT_METRICS_PORT + the shard index; 0 picks a free port.
    port: int | None = None
    # Also export the process's CPU, memory and file descriptors.
    process_metrics: bool = True
    # At most this many workers get per-worker series of their own; the rest are counted in one
    # aggregate series per metric (docs/observability.md).
    worker_series: int = DEFAULT_WORKER_SERIES

    def __post_init__(self) -> None:
        _require(self.port is None or 0 <= self.port <= 65535, f"metrics port {self.port} is not 0..65535")
        _require(self.worker_series >= 0, f"worker_series must be 0 or more, not {self.worker_series}")


@dataclass(frozen=True)
class ServerConfig:
    """Every setting of one shard server: ``psserver serve --config FILE`` (TOML) holds any of them,
    its flags override the file, and the rest keep these defaults (docs/configuration.md lists all)."""

    # The rule, the shard's place in the model and every limit of the shard ([shard] in the file).
    shard: ShardConfig
    # Address to bind.
    host: str = "0.0.0.0"
    # 0 picks a free port (``ServerApp.port`` tells which).
    port: int = 50051
    # Threads torch uses for updates; None ("auto") leaves the process's setting alone.
    torch_threads: int | None = 2
    # How long in-progress RPCs may run on after a drain starts before they are cancelled.
    drain_seconds: float = 10.0
    # DEBUG, INFO, WARNING or ERROR: what ``psserver serve`` logs.
    log_level: str = "INFO"
    # Message, stream and flow-control limits of the gRPC transport.
    transport: ServerLimits = field(default_factory=ServerLimits)
    # TLS and the bearer token.
    security: SecurityConfig = field(default_factory=SecurityConfig)
    # None (false in the file): no Prometheus endpoint.
    metrics: MetricsConfig | None = field(default_factory=MetricsConfig)
    # None: no checkpoints, nothing restored.
    checkpoints: CheckpointConfig | None = None
    # glibc's allocator settings, applied when ``psserver serve`` starts (psserver.allocator).
    allocator: AllocatorConfig = field(default_factory=AllocatorConfig)
    # Written (atomically) once the server accepts RPCs; removed when it drains.
    ready_file: Path | None = None
    # None: a lone server. Set (``--etcd URL``): one replica of the shard's replica set.
    replication: ReplicationConfig | None = None

    def __post_init__(self) -> None:
        _require(0 <= self.port <= 65535, f"port {self.port} is not 0..65535")
        _require(self.torch_threads is None or self.torch_threads >= 1, "torch_threads must be >= 1")
        _require(self.drain_seconds >= 0, f"drain_seconds must be >= 0, got {self.drain_seconds}")
        _require(
            self.log_level in LOG_LEVELS, f"log_level must be one of {', '.join(LOG_LEVELS)}, not {self.log_level!r}"
        )
        _require(
            self.replication is None or self.transport.max_message_bytes > REPLICATION_CHUNK_BYTES + 1024,
            f"transport.max_message_bytes {self.transport.max_message_bytes}: a replica takes the state in messages "
            f"of {REPLICATION_CHUNK_BYTES // 2**20} MiB; allow at least {REPLICATION_CHUNK_BYTES // 2**20 + 1} MiB",
        )
        problem = chunk_bytes_problem(self.shard.chunk_bytes, self.transport.max_message_bytes)
        _require(problem is None, f"shard.chunk_bytes: {problem} (transport.max_message_bytes)")

    @property
    def metrics_port(self) -> int | None:
        """The port the metrics endpoint is asked to bind (None: no endpoint)."""
        if self.metrics is None:
            return None
        return DEFAULT_METRICS_PORT + self.shard.shard_index if self.metrics.port is None else self.metrics.port


class _Reaper:
    """Evicts workers whose lease expired and ends pushes that went idle or fell behind their pace."""

    def __init__(self, shard: Shard, interval_s: float) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(shard, interval_s), name="lease-reaper", daemon=True)
        self._thread.start()

    def _run(self, shard: Shard, interval_s: float) -> None:
        # The shard logs and counts each eviction and cancellation.
        while not self._stop.wait(interval_s):
            shard.evict_expired()
            shard.cancel_stalled_pushes()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _restore(shard: Shard, directory: Path, metrics: ShardMetrics | None) -> None:
    """Restore the newest intact checkpoint in ``directory`` (none: the shard starts empty)."""
    try:
        restored = checkpoint.restore(shard, directory, metrics)
    except (checkpoint.CheckpointError, StateError) as error:
        raise CheckpointRestoreError(str(error)) from None
    if restored is not None:
        _LOGGER.info(
            "restored checkpoint %s: clock %d, %d worker(s)", restored, shard.clock, len(shard.worker_snapshot())
        )


class ServerApp:
    """One shard served over gRPC, with its metrics endpoint, checkpointer, reaper and ready file."""

    def __init__(
        self,
        config: ServerConfig,
        shard: Shard,
        metrics: ShardMetrics | None,
        checkpointer: checkpoint.Checkpointer | None,
        auth_token: str | None,
    ) -> None:
        """Use ``ServerApp.build``; this only assembles what it built."""
        self.config = config
        self.shard = shard
        self.metrics = metrics
        self.checkpointer = checkpointer
        self.auth_token = auth_token
        # The checkpoint ``stop`` wrote last (None until then, or without checkpoints).
        self.final_checkpoint: checkpoint.Written | None = None
        self._running: RunningServer | None = None
        self._metrics_server: MetricsServer | None = None
        self._metrics_port: int | None = None
        self._reaper: _Reaper | None = None
        self._drained = False
        self._stopped = False
        # Set when this replica stepped down as primary: ``psserver serve`` then ends (its restart
        # comes back as a backup).
        self.deposed = threading.Event()
        self.replica: ReplicaNode | None = None
        if config.replication is not None:
            self.replica = ReplicaNode(
                Coordinator(config.replication, config.shard.shard_index),
                NodeParts(shard, self._restore_for_replica, self._checkpoint_clock, self._on_deposed, self._peers()),
            )
            if metrics is not None:
                metrics.watch_replica(self.replica.view)

    def _restore_for_replica(self, shard: Shard) -> None:
        if self.config.checkpoints is not None:
            try:
                _restore(shard, self.config.checkpoints.directory, self.metrics)
            except CheckpointRestoreError as error:
                raise StateError(str(error)) from None

    def _checkpoint_clock(self) -> int | None:
        found = checkpoint.list_checkpoints(self.config.checkpoints.directory) if self.config.checkpoints else []
        return found[-1][1] if found else None

    def _on_deposed(self, why: str) -> None:
        self.deposed.set()

    def _peers(self) -> PeerAccess:
        """Calls to the other replicas carry what this server asks of its own callers."""
        tls = self.config.security.tls
        return PeerAccess(tls.as_client() if tls is not None else None, bearer_metadata(self.auth_token))

    @classmethod
    def build(cls, config: ServerConfig) -> ServerApp:
        """Read the security files, build the shard and restore the newest checkpoint; binds nothing.

        Raises ``SecurityFilesError``, ``CheckpointRestoreError``, or ``ServerConfigError`` for a
        ready file that could not be written."""
        if config.ready_file is not None:
            folder = config.ready_file.parent
            # Checked before anything binds: a server that could not say it is ready would serve unseen.
            _require(
                folder.is_dir() and os.access(folder, os.W_OK),
                f"--ready-file {config.ready_file}: its folder {folder} does not exist or is not writable",
            )
        security = config.security
        try:
            token = read_token_file(security.auth_token_file) if security.auth_token_file is not None else None
            if security.tls is not None:
                security.tls.credentials()  # fail now, naming the file, rather than at bind time
            if config.replication is not None and config.replication.etcd_tls is not None:
                config.replication.etcd_tls.check_files()
        except SecurityConfigError as error:
            raise SecurityFilesError(str(error)) from None
        if config.torch_threads is not None:
            torch.set_num_threads(config.torch_threads)
        metrics = None
        if config.metrics is not None:
            info = {
                "rule": config.shard.rule.rule.name,
                "consistency": config.shard.consistency.model.value,
                "num_shards": str(config.shard.num_shards),
            }
            metrics = ShardMetrics(
                config.shard.shard_index,
                info,
                process_metrics=config.metrics.process_metrics,
                worker_series=config.metrics.worker_series,
            )
        shard = Shard(config.shard, observer=metrics)
        checkpointer = None
        if config.checkpoints is not None:
            every = config.checkpoints
            if config.replication is None:
                # A replica restores one only when it becomes primary with nothing newer (node.py).
                _restore(shard, every.directory, metrics)
            checkpointer = checkpoint.Checkpointer(
                shard, every.directory, every.keep, every.every_updates, every.every_seconds, observer=metrics
            )
        return cls(config, shard, metrics, checkpointer, token)

    def start(self) -> ServerApp:
        """Serve metrics, bind the gRPC port, start the checkpointer and the reaper, write the ready file.

        Raises ``MetricsBindError`` or ``BindError`` (after closing whatever it opened)."""
        if self._running is not None:
            raise RuntimeError("this server has already been started")
        config = self.config
        scrape_port = config.metrics_port
        if self.metrics is not None and scrape_port is not None:
            try:
                self._metrics_server = serve_metrics(self.metrics.registry, config.host, scrape_port)
            except OSError as error:
                raise MetricsBindError(f"cannot serve metrics on {config.host}:{scrape_port}: {error}") from None
            self._metrics_port = self._metrics_server.port
            _LOGGER.info("Prometheus metrics at http://%s:%d/metrics", config.host, self._metrics_port)
        try:
            self._running = start_server(
                self.shard,
                f"{config.host}:{config.port}",
                interceptors=self._interceptors(),
                tls=config.security.tls,
                limits=config.transport,
                checkpointer=self.checkpointer,
                replication=self._replica_serving(),
            )
        except (OSError, RuntimeError) as error:
            self._close_metrics()
            self._metrics_port = None
            raise BindError(f"cannot listen on {config.host}:{config.port}: {error}") from None
        if self.checkpointer is not None:
            self.checkpointer.start()
        if self.replica is not None:
            self._start_replica()
        limits = config.shard
        # Often enough that a push is ended within a quarter of its shortest limit past it.
        shortest = min(limits.lease_seconds, limits.receive_idle_seconds, limits.transfer_pace.grace_s or math.inf)
        self._reaper = _Reaper(self.shard, max(0.05, shortest / 4))
        if config.ready_file is not None:
            write_ready_file(config.ready_file, self.ready_info)
        return self

    def _replica_serving(self) -> ReplicaServing | None:
        if self.replica is None:
            return None
        return ReplicaServing(NodeHooks(self.replica), add_replica_service(self.replica.standby))

    def _start_replica(self) -> None:
        assert self.replica is not None and self.config.replication is not None
        address = self.config.replication.advertise or self.address
        coordinator = self.replica.coordinator
        coordinator.place(ReplicaNode.unique_name(address), address)
        patience = time.monotonic() + START_ETCD_PATIENCE_S
        while True:
            try:
                coordinator.grant()
                break
            except EtcdError as error:
                if error.timed_out and time.monotonic() < patience:
                    _LOGGER.warning("etcd is slow to answer (%s); asking again", error)
                    time.sleep(START_ETCD_RETRY_S)
                    continue
                self.drain(0)
                raise BindError(f"cannot reach etcd at {', '.join(self.config.replication.etcd)}: {error}") from None
        self.replica.start()
        _LOGGER.info(
            "replica %s of shard %d; etcd %s", coordinator.name, self.config.shard.shard_index, coordinator.prefix
        )

    def _interceptors(self) -> list[LatencyInterceptor | AuthInterceptor]:
        # In order, the first outermost: latency sees the token check's refusals.
        interceptors: list[LatencyInterceptor | AuthInterceptor] = []
        if self.metrics is not None:
            interceptors.append(LatencyInterceptor(self.metrics))
        if self.auth_token is not None:
            shard = self.shard
            # Counted in Status and the metrics like the shard's own refusals.
            interceptors.append(
                AuthInterceptor(self.auth_token, lambda _method: shard.count_rejected("unauthenticated"))
            )
        return interceptors

    @property
    def port(self) -> int:
        """The bound gRPC port (the one picked when the config asked for 0)."""
        if self._running is None:
            raise RuntimeError("the server has not been started")
        return self._running.port

    @property
    def metrics_port(self) -> int | None:
        """The bound metrics port; None without metrics."""
        return self._metrics_port

    @property
    def ready_info(self) -> ReadyInfo:
        """What the ready file says: where this server listens, and what it serves."""
        return ReadyInfo(
            host=self.config.host,
            port=self.port,
            pid=os.getpid(),
            shard_index=self.config.shard.shard_index,
            num_shards=self.config.shard.num_shards,
            rule=self.config.shard.rule.rule.name,
            clock=self.shard.clock,
            metrics_port=self.metrics_port,
        )

    @property
    def address(self) -> str:
        """HOST:PORT to dial this server at (loopback when it listens on every interface)."""
        return self.ready_info.address

    def drain(self, grace_seconds: float | None = None) -> None:
        """Stop serving: health turns NOT_SERVING, new ParameterServer RPCs are refused with
        UNAVAILABLE, those in progress get up to ``grace_seconds`` (default: the config's
        ``drain_seconds``) to finish, then the gRPC server stops and cancels what is left."""
        if self._drained or self._running is None:
            return
        self._drained = True
        if self.config.ready_file is not None:
            # The file says "serving"; a draining server no longer is.
            self.config.ready_file.unlink(missing_ok=True)
        self._running.stop(self.config.drain_seconds if grace_seconds is None else grace_seconds)
        _LOGGER.info("stopped")

    def stop(self) -> None:
        """Drain (if not done yet), stop the reaper and checkpointer, write the final checkpoint and
        close the metrics endpoint. A failed final checkpoint is logged, not raised."""
        if self._stopped:
            return
        self._stopped = True
        self.drain()
        if self._reaper is not None:
            self._reaper.stop()
        serving_shard = self.replica is None or self.replica.serving()
        if self.replica is not None:
            self.replica.stop()
        if self.checkpointer is not None and self._running is not None and serving_shard:
            # Every push has finished or was cancelled: the last checkpoint holds all acknowledged ones.
            self.checkpointer.stop()
            try:
                self.final_checkpoint = self.checkpointer.write_now()
                _LOGGER.info("final checkpoint %s (clock %d)", self.final_checkpoint.path, self.final_checkpoint.clock)
            except checkpoint.CheckpointError as error:
                _LOGGER.error("final checkpoint failed: %s", error)
        self._close_metrics()

    def _close_metrics(self) -> None:
        if self._metrics_server is not None:
            self._metrics_server.close()
            self._metrics_server = None

    def __enter__(self) -> ServerApp:
        if self._running is None:
            self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()
