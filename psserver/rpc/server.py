"""Build the gRPC server for one shard: the servicer, health, reflection, transport limits and
the drain gate. ``psserver.app.ServerApp`` composes it with the rest of a running shard server.

The server is gRPC's asyncio one, on an event loop of its own thread: every call is a coroutine,
the shard's work runs on a pool of ``WORK_THREADS`` threads, and a call waiting in the shard
holds none of them (psserver.rpc.awaiting). Nothing is sized to the number of workers.

Stopping drains: the health service turns NOT_SERVING and keeps answering, new
ParameterServer RPCs are refused with UNAVAILABLE (clients retry them after a restart or
elsewhere), and the RPCs already in progress get up to the grace period to finish before the
server stops and cancels whatever is left.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from psproto import codec
from psproto.errors import Reason
from psproto.v1 import ps_pb2
from psserver.core.checkpoint import Checkpointer
from psserver.core.shard import Shard
from psserver.rpc.awaiting import StepRunner
from psserver.rpc.replication_hooks import UNREPLICATED, Replication
from psserver.rpc.security import ServerTls
from psserver.rpc.servicer import ParameterServerServicer, add_to_server
from psserver.rpc.status_codes import refusal, refuse
from psserver.rpc.wrapped_handlers import AioInterceptor, Handler, WrappedHandlers, rewrapped

T = TypeVar("T")

_LOGGER = logging.getLogger(__name__)
SERVICE_NAME = ps_pb2.DESCRIPTOR.services_by_name["ParameterServer"].full_name
_SERVICE_PREFIX = f"/{SERVICE_NAME}/"
# Large enough for chunks of a few MiB plus headers; clients never need more.
MAX_MESSAGE_BYTES = codec.DEFAULT_MAX_MESSAGE_BYTES
# HTTP/2 lets a stream's window be at most 2^31 - 1 bytes; below 64 KiB (about HTTP/2's
# default of 65,535) a multi-MiB push would stall on window updates.
MIN_RECEIVE_WINDOW_BYTES = 64 * 1024
MAX_RECEIVE_WINDOW_BYTES = 2**31 - 1
# HTTP/2's largest frame (SETTINGS_MAX_FRAME_SIZE may be 16 KiB to 2^24 - 1).
MAX_FRAME_BYTES = 2**24 - 1
# One chunk (1 MiB by default) in flight per stream. Every push waiting for a receive buffer
# holds up to this much in the transport, so it sets how the server's memory grows with workers
# pushing at once: against 4 MiB, a ResNet-18 shard with 16 workers peaked at 407 MB instead of
# 504 (limit 444), one worker's step was 1.04x as fast and 16 workers' aggregate 1.21x
# (``python -m benchmarks.receive_window --quick --windows 4MiB,1MiB``, docs/performance.md).
# See ServerLimits.receive_window_bytes.
DEFAULT_RECEIVE_WINDOW_BYTES = 1024 * 1024
# Clients ping over HTTP/2 to notice a silent link (psworker.channels: every keepalive interval,
# at least 1 s, also between calls). gRPC's default server policy takes one ping per 5 minutes
# without data and, after two strikes, answers faster ones with GOAWAY "too_many_pings" (the
# client then doubles its interval, silently). This accepts one every half second, with or
# without calls: twice the fastest client interval, so timer jitter never counts as a strike.
SERVER_MIN_PING_INTERVAL_S = 0.5
KEEPALIVE_SERVER_OPTIONS: list[tuple[str, int]] = [
    ("grpc.http2.min_ping_interval_without_data_ms", round(SERVER_MIN_PING_INTERVAL_S * 1000)),
    ("grpc.keepalive_permit_without_calls", 1),
]


@dataclass(frozen=True)
class ServerLimits:
    """Transport limits; past each, gRPC refuses with RESOURCE_EXHAUSTED (or, for streams, queues)."""

    # Largest message received or sent (a chunk plus its header).
    max_message_bytes: int = MAX_MESSAGE_BYTES
    # RPCs in progress or queued at once over all connections; more are refused. A worker has at
    # most a push, a pull, a heartbeat and a Status in progress, and a waiting one costs no thread.
    max_concurrent_rpcs: int | None = 4096
    # Concurrent streams on one HTTP/2 connection (one client); more wait for a free one.
    max_streams_per_connection: int = 256
    # Bytes a client may send on a stream before the server reads them (HTTP/2 flow-control
    # window); None lets gRPC size it: at least 4 MiB while its memory quota is not under
    # pressure, twice the bandwidth-delay product it probes when that is more. A push waiting
    # for a receive buffer holds up to this much in the transport; on loopback gRPC's sizing
    # let 16 concurrently pushing workers add about 32 MiB each to the server's peak
    # (benchmarks/receive_window.py measures both).
    receive_window_bytes: int | None = DEFAULT_RECEIVE_WINDOW_BYTES

    def __post_init__(self) -> None:
        if self.max_concurrent_rpcs is not None and self.max_concurrent_rpcs < 1:
            raise ValueError(f"max_concurrent_rpcs must be >= 1, not {self.max_concurrent_rpcs}")
        if not 1 <= self.max_message_bytes < 2**31 or self.max_streams_per_connection < 1:
            raise ValueError(f"max_message_bytes must be 1..{2**31 - 1} and max_streams_per_connection >= 1: {self}")
        window = self.receive_window_bytes
        if window is not None and not MIN_RECEIVE_WINDOW_BYTES <= window <= MAX_RECEIVE_WINDOW_BYTES:
            raise ValueError(
                f"receive_window_bytes {window} is outside {MIN_RECEIVE_WINDOW_BYTES}..{MAX_RECEIVE_WINDOW_BYTES} "
                "(64KiB to HTTP/2's largest window)"
            )

    def channel_options(self) -> list[tuple[str, int]]:
        """The gRPC server options these limits set."""
        options = [
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_concurrent_streams", self.max_streams_per_connection),
        ]
        if self.receive_window_bytes is not None:
            # A fixed window, as grpc-java and grpc-go configure one: probing off, window set.
            # Probing also raised the largest frame a client may send above HTTP/2's 16 KiB; without
            # it a 2 MiB chunk arrives as 128 frames (docs/performance.md, Memory, gives what that
            # cost and which of those numbers benchmarks/receive_window.py reproduces).
            options += [
                ("grpc.http2.bdp_probe", 0),
                ("grpc.http2.lookahead_bytes", self.receive_window_bytes),
                ("grpc.http2.max_frame_size", min(self.receive_window_bytes, MAX_FRAME_BYTES)),
            ]
        return options


class DrainInterceptor(AioInterceptor):
    """Counts the ParameterServer RPCs in progress and, once ``start`` is called, refuses new ones.

    Health and reflection are never refused, so probes see NOT_SERVING while the server drains."""

    def __init__(self, admission: Callable[[str], grpc.Status | None] = lambda _method: None) -> None:
        """``admission``: a refusal of a method on this server beside draining (a replica that is
        not its shard's primary), or None."""
        self._lock = threading.Condition()
        self._in_flight = 0
        self.draining = False
        self._admission = admission
        self._gated = WrappedHandlers(self._gated_handler)

    def start(self) -> None:
        with self._lock:
            self.draining = True

    def wait_idle(self, timeout_seconds: float) -> bool:
        """Wait until no ParameterServer RPC is in progress; False when ``timeout_seconds`` ran out first."""
        deadline = time.monotonic() + timeout_seconds
        with self._lock:
            while self._in_flight:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(remaining)
            return True

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def _admitted(self) -> bool:
        with self._lock:
            if not self.draining:
                self._in_flight += 1
            return not self.draining

    def _finished(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self._lock.notify_all()

    async def intercept_service(  # type: ignore[override]  # the stub forgets None (an unknown method)
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        full_name = handler_call_details.method
        if handler is None or not full_name.startswith(_SERVICE_PREFIX):
            return handler
        return self._gated.get(full_name, handler)

    def _gated_handler(self, handler: Handler, full_name: str) -> Handler:
        method = full_name.rpartition("/")[2]
        refused = refusal(
            Reason.DRAINING, f"{method} refused: this server is shutting down (draining); retry after it restarts"
        )

        def unary(behaviour: Callable[[Any, Any], Coroutine[Any, Any, Any]]) -> Any:
            async def admit(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                await self._refuse_elsewhere(method, context)
                if not self._admitted():
                    await refuse(context, refused)
                try:
                    return await behaviour(request, context)
                finally:
                    self._finished()

            return admit

        def streaming(behaviour: Callable[[Any, Any], AsyncIterator[Any]]) -> Any:
            async def admit(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
                await self._refuse_elsewhere(method, context)
                if not self._admitted():
                    await refuse(context, refused)
                try:
                    async for message in behaviour(request, context):
                        yield message
                finally:
                    self._finished()

            return admit

        return rewrapped(handler, unary, streaming)

    async def _refuse_elsewhere(self, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        refused = self._admission(method)
        if refused is not None:
            await refuse(context, refused)


class _LoopThread:
    """An event loop running on a thread of its own, for the server's coroutines."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=f"{RPC_THREAD_PREFIX}-loop", daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the loop and wait for its result here."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self.loop.close()


# The server's work threads: they decode, apply and encode, never wait in the shard, so a few
# per core keep the cores busy whatever the number of workers (the asyncio default's size).
WORK_THREADS = min(32, (os.cpu_count() or 1) + 4)
RPC_THREAD_PREFIX = "psserver-rpc"


@dataclass(frozen=True)
class ReplicaServing:
    """A replica's part of the server: its hooks, and the service the other replicas call."""

    hooks: Replication
    add_services: Callable[[grpc.aio.Server], None]


@dataclass
class RunningServer:
    server: grpc.aio.Server
    port: int
    # grpc_health's asyncio HealthServicer (health.aio; not in the type stubs).
    health: Any
    drain: DrainInterceptor
    _loop: _LoopThread
    _pool: futures.ThreadPoolExecutor
    _runner: StepRunner
    _stopped: bool = field(default=False)

    def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        self._loop.run(self._set_health(status))

    async def _set_health(self, status: Any) -> None:
        for service in ("", SERVICE_NAME):
            await self.health.set(service, status)

    def stop(self, grace_seconds: float) -> None:
        """Drain: health reports NOT_SERVING (and keeps answering), new ParameterServer RPCs are
        refused with UNAVAILABLE, the ones in progress get up to ``grace_seconds`` to finish; then
        the server stops, cancelling any still running."""
        if self._stopped:
            return
        self._stopped = True
        self.set_serving(False)
        self.drain.start()
        if not self.drain.wait_idle(grace_seconds):
            _LOGGER.warning(
                "%d RPC(s) still running after the %.1f s drain; cancelling them", self.drain.in_flight, grace_seconds
            )
        self._loop.run(self.server.stop(0))
        self._runner.stop()
        self._loop.close()
        self._pool.shutdown(wait=False, cancel_futures=True)


def start_server(
    shard: Shard,
    address: str,
    interceptors: Sequence[AioInterceptor] = (),
    tls: ServerTls | None = None,
    limits: ServerLimits | None = None,
    checkpointer: Checkpointer | None = None,
    replication: ReplicaServing | None = None,
) -> RunningServer:
    """Start serving ``shard`` on ``address`` (``host:port``; port 0 picks a free one).

    With ``tls`` the port speaks only TLS (mutual TLS when it names a client CA). Interceptors
    run in order, the first outermost (e.g. latency, then the bearer-token check); the drain
    gate that ``RunningServer.stop`` closes comes after them."""
    limits = limits or ServerLimits()
    credentials = tls.credentials() if tls is not None else None
    loop = _LoopThread()
    # Named, so a thread dump (py-spy, faulthandler) tells the server's work from the rest.
    pool = futures.ThreadPoolExecutor(max_workers=WORK_THREADS, thread_name_prefix=RPC_THREAD_PREFIX)
    runner = StepRunner(loop.loop, pool)
    # Innermost, so the other interceptors (latency) see its refusals while draining.
    hooks = replication.hooks if replication is not None else UNREPLICATED
    drain = DrainInterceptor(hooks.admission)

    async def serve() -> tuple[grpc.aio.Server, int, Any]:
        server = grpc.aio.server(
            options=[*limits.channel_options(), *KEEPALIVE_SERVER_OPTIONS, ("grpc.so_reuseport", 0)],
            interceptors=[*interceptors, drain],
            maximum_concurrent_rpcs=limits.max_concurrent_rpcs,
        )
        add_to_server(ParameterServerServicer(shard, runner, checkpointer, limits.max_message_bytes, hooks), server)
        if replication is not None:
            replication.add_services(server)
        health_servicer = health.aio.HealthServicer()  # type: ignore[attr-defined]
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        reflection.enable_server_reflection((SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        if credentials is not None:
            port = server.add_secure_port(address, credentials)
        else:
            port = server.add_insecure_port(address)
        if port == 0:
            raise OSError(f"could not bind {address}: the port is in use or the address is not local")
        await server.start()
        return server, port, health_servicer

    try:
        server, port, health_servicer = loop.run(serve())
    except BaseException:
        loop.close()
        pool.shutdown(wait=False)
        raise
    running = RunningServer(server, port, health_servicer, drain, loop, pool, runner)
    running.set_serving(True)
    return running
