"""PSClient: the gRPC :class:`~psworker.service.ParameterService`, joined to every shard of a hetps server.

The client fans each pull and push out to all shards concurrently; each shard reads and
writes its own slice of the caller's flat buffer, so no model-sized temporary is made.

A gradient's path from ``ParameterServerOptimizer.step``, never returning to a module it left:
``psworker.optim`` (step) -> ``psworker.procedures`` (the procedure gathers the gradients into
the binding's one preallocated flat buffer and hands it over) -> ``psworker.client``
(``PSClient.push``: a push id, one task per shard) -> ``psworker.push_encoding`` (the slice in the
push dtype) -> ``psworker.transfer`` -> ``psproto.codec`` / ``psproto.wire`` (bytes written straight
from the tensor) -> gRPC. The new parameters come back along ``transfer.receive_params`` into the
binding's flat parameter buffer.

It rides through network failures and server restarts (``psworker.sessions`` decides how, from the
refusal's reason). Every call has a deadline sized to its payload (``psworker.deadlines``) and every
connection pings the server (``psworker.channels``), so a silent link fails the calls on it within
1.5 keepalive intervals instead of hanging them. A call that got no answer (UNAVAILABLE,
DEADLINE_EXCEEDED) is sent again with exponential backoff on a new connection, the old channel
closed, each replacement logged; a push keeps its push id (the server applies a push id at most once
and acknowledges a repeat as a duplicate). A shard that no longer knows the worker (UNKNOWN_WORKER:
it was evicted, or the server restarted without its record) is joined again with ``resume``, which
keeps the worker's push-id memory on the server. When a restarted shard is behind the clocks this
client already saw, the rollback is recorded in ``rollbacks``.

A shard given as a replica set (``HOST:PORT|HOST:PORT``) is followed: a replica that is not the
primary (NOT_PRIMARY) sends the call to the primary it names, a replica that gives no answer to the
next one of the set, each switch logged and counted in ``stats.follows``.
"""

from __future__ import annotations

import contextlib
import logging
import random
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

import grpc
import torch

from psproto import codec
from psproto.layout import Layout
from psproto.security import ClientTls, bearer_metadata
from psproto.v1 import ps_pb2
from psworker import transfer
from psworker.channels import (
    DEFAULT_KEEPALIVE_S,
    check_keepalive,
    close_channel,
    open_channel,
    shard_addresses,
    single_threaded_pulls_pay,
)
from psworker.deadlines import DeadlinePolicy, payload_bytes
from psworker.fan_out import fan_out
from psworker.push_encoding import OnePush, PushEncoder, wire_dtypes
from psworker.service import PushResult, ServerMismatchError
from psworker.sessions import (
    LEAVE_TIMEOUT_S,
    NO_RETRY,
    RESEND,
    ClientStats,
    Recovery,
    RetryPolicy,
    Rollback,
    ShardSession,
    first_join,
    is_future_clock,
    join_shard,
    next_address,
    observe_clock,
    pulled_shard_clock,
    quick_pause,
    reconnect_note,
    recovery_for,
)

__all__ = [
    "NO_RETRY",
    "ClientConfig",
    "ClientStats",
    "DeadlinePolicy",
    "PSClient",
    "PushResult",
    "RetryPolicy",
    "Rollback",
    "ServerMismatchError",
]

ResultT = TypeVar("ResultT")
_LOGGER = logging.getLogger(__name__)
# A checkpoint writes the parameters and the rule's state: a few copies of the shard, at the floor rate.
_CHECKPOINT_COPIES = 4


@dataclass(frozen=True)
class ClientConfig:
    """How a client talks to its shards: wire dtypes, chunking, connections, retries, deadlines,
    security. ``PSClient(servers, layout)`` takes the defaults; ``psworker train --config`` reads
    it from its ``[train.client]`` table. Every value is checked here, before any connection."""

    # What pushes and pulls travel in, unless push_dtype or pull_dtype says otherwise.
    wire_dtype: str = "fp32"
    # What pushes travel in (default: wire_dtype); int8 is the 8-bit block codec.
    push_dtype: str | None = None
    # What pulled parameters travel in (default: wire_dtype); never int8.
    pull_dtype: str | None = None
    # With int8 pushes, carry each push's quantisation error into the next push.
    error_feedback: bool = True
    # Largest payload of one message (bytes, or "1MiB"): what pushes and Init are cut into.
    chunk_bytes: int = codec.DEFAULT_CHUNK_BYTES
    # How long the first Join waits for each shard to come up.
    connect_timeout: float = 30.0
    # This process succeeds a dead worker of the same name (an engine such as Ray restarted it, so
    # the earlier one can no longer push): its first Join takes over that name's record and push-id
    # memory at once, rather than waiting for the record's lease to run out.
    takes_over_name: bool = False
    # HTTP/2 ping interval: a link that went silent is noticed within 1.5 times this.
    keepalive_seconds: float = DEFAULT_KEEPALIVE_S
    # Backoff for calls that got no answer; give_up_seconds: how long a call may keep failing.
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # Each call's deadline: base_seconds plus its payload at min_bytes_per_second.
    deadlines: DeadlinePolicy = field(default_factory=DeadlinePolicy)
    # The CA that signed the servers (turns TLS on), with this client's cert and key for mutual TLS.
    tls: ClientTls | None = None
    # The servers' bearer token (psworker train reads it from --auth-token-file).
    auth_token: str | None = None

    def __post_init__(self) -> None:
        wire_dtypes(self.wire_dtype, self.push_dtype, self.pull_dtype)
        check_keepalive(self.keepalive_seconds)
        problem = codec.chunk_bytes_problem(self.chunk_bytes)
        if problem is not None:
            raise ValueError(f"chunk_bytes: {problem}")


class PSClient:
    """A worker's (or observer's) connection to every shard of one model."""

    def __init__(
        self,
        servers: str | Sequence[str],
        layout: Layout,
        name: str | None = None,
        device: str = "cpu",
        observer: bool = False,
        reinit: Callable[[], torch.Tensor] | None = None,
        config: ClientConfig | None = None,
    ) -> None:
        """``config``: how to talk to the shards (:class:`ClientConfig`; its defaults when None);
        ``observer``: pull and read status without pushing; ``reinit``: the current parameters, for
        a shard that came back empty (restarted without a checkpoint)."""
        config = config or ClientConfig()
        self.config = config
        # Each shard's replica set: one address, or a primary and its backups in any order.
        self.replicas = shard_addresses(servers, layout.num_shards)
        push, pull = wire_dtypes(config.wire_dtype, config.push_dtype, config.pull_dtype)
        self.keepalive_seconds = config.keepalive_seconds
        self.deadlines = config.deadlines
        self.layout = layout
        self.name = name or f"{socket.gethostname()}-{id(self):x}"
        self.device = device
        self.observer = observer
        self.wire_dtype = pull  # what pulls (and PushPull's parameters) come back in
        self.push_encoder = PushEncoder(push, config.error_feedback, config.chunk_bytes)
        self.connect_timeout = config.connect_timeout
        self.retry = config.retry
        self.reinit = reinit
        self.stats = ClientStats()
        self._credentials = config.tls.credentials() if config.tls is not None else None
        lengths = [shard.length for shard in layout.shards]
        self._single_threaded_pulls = single_threaded_pulls_pay(lengths)
        self._metadata = bearer_metadata(config.auth_token)
        # Push ids grow across processes too: a restarted worker starts above any id it used before,
        # so a server that remembers its name never mistakes a new push for a retried one.
        self._next_push_id = time.time_ns() // 1000
        self._push_id_lock = threading.Lock()
        self._session_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(self.replicas)), thread_name_prefix="psclient")
        # Set when close() starts: a call still in flight then fails instead of retrying or joining
        # again, or a worker stopped with Ctrl-C would come back to life on the shard it just left.
        self._closing = threading.Event()
        self.sessions: list[ShardSession] = []
        try:
            for index in range(len(self.replicas)):
                self.sessions.append(self._first_join(index))
        except BaseException:
            # Leave the shards already joined: a record left behind would count as a live worker
            # (a BSP barrier would wait for it) until its lease ran out.
            self.close()
            raise
        self.pulled_clocks = [s.join.clock for s in self.sessions]
        # The highest clock each shard has shown this client (pull or push); a lower one means a rollback.
        self.seen_clocks = [s.join.clock for s in self.sessions]
        # Per shard: whether its Push, and its PushPull, goes as one unary call (transfer.push, transfer.push_pull).
        self.unary_pushes, self.unary_push_pulls = transfer.unary_forms(lengths, push, pull, config.chunk_bytes)

    # -- membership -------------------------------------------------------------------

    def _channel(self, address: str) -> grpc.Channel:
        return open_channel(address, self._credentials, self.keepalive_seconds, self._single_threaded_pulls)

    def _first_join(self, index: int) -> ShardSession:
        """Join shard ``index``, waiting for it to come up (``sessions.first_join`` says how)."""

        def retried(
            recovery: Recovery, error: grpc.RpcError, old: str, new: str, call_seconds: float, failing_seconds: float
        ) -> None:
            self.stats.retries += 1
            if recovery is Recovery.WAIT_FOR_NAME:
                _LOGGER.warning("%s: shard %d: %s; retrying", self.name, index, error.details())
            if new != old:
                self.stats.follows += 1
                budget = max(self.connect_timeout, self.retry.give_up_seconds)
                note = reconnect_note(index, old, new, error, call_seconds, failing_seconds, budget)
                _LOGGER.warning("%s: %s", self.name, note)

        return first_join(
            lambda channel, address, resume: self._join(index, address, channel, self.connect_timeout, resume=resume),
            self._channel,
            self.replicas[index],
            self.retry,
            max(self.connect_timeout, self.retry.give_up_seconds),
            retried,
            takes_over=self.config.takes_over_name,
        )

    def _join(
        self, index: int, address: str, channel: grpc.Channel, timeout: float, resume: bool = False
    ) -> ShardSession:
        request = ps_pb2.JoinRequest(
            worker_name=self.name,
            device=self.device,
            role=ps_pb2.ROLE_OBSERVER if self.observer else ps_pb2.ROLE_WORKER,
            layout=self.layout.to_proto(),
            layout_hash=self.layout.hash,
            resume=resume,
        )
        # A single server is waited for; a replica of a set is not, as another one may be up.
        wait = len(self.replicas[index]) == 1
        return join_shard(channel, address, self.layout.shard(index), request, timeout, self._metadata, wait)

    def _rejoin(self, index: int, stale: ShardSession) -> ShardSession:
        """Join shard ``index`` again (same name, push-id memory kept); Init it if it came back empty."""
        with self._session_lock:
            current = self.sessions[index]
            if current is not stale:
                return current  # another thread already re-joined
            session = self._join(index, current.address, current.channel, self.deadlines.short(), resume=True)
            self.stats.rejoins += 1
            self.push_encoder.reset(index)  # the shard may have lost pushes the 8-bit residual assumed applied
            _LOGGER.warning(
                "%s: re-joined shard %d at %s as worker %d (clock %d)",
                self.name,
                index,
                session.address,
                session.worker_id,
                session.join.clock,
            )
            if not session.join.initialized and not self.observer:
                if self.reinit is None:
                    raise ServerMismatchError(
                        f"shard {index} at {session.address} came back without parameters (restarted without a "
                        "checkpoint) and this client has none to upload; give PSClient a reinit callable"
                    )
                self._init_shard(session, self.reinit())
            self.sessions[index] = session
            self._observe_clock(index, session.join.clock)
            return session

    def _observe_clock(self, index: int, clock: int, seen_when_sent: int | None = None) -> None:
        rollback = observe_clock(self.seen_clocks, index, clock, seen_when_sent)
        if rollback is not None:
            self.stats.rollbacks.append(rollback)
            _LOGGER.warning("%s: %s", self.name, rollback)

    def _call(self, index: int, call: Callable[[ShardSession], ResultT]) -> ResultT:
        """Run ``call`` on shard ``index``, retrying with backoff, reconnecting, following the
        primary and re-joining as needed.

        Retries go on while the call has been failing for less than the retry budget, counted from
        its first failure: time spent in a working exchange is not counted against it."""
        policy = self.retry
        failing_since: float | None = None
        backoff = policy.initial_backoff
        unanswered = 0
        while True:
            session = self.sessions[index]
            started = time.monotonic()
            try:
                return call(session)
            except grpc.RpcError as error:
                now = time.monotonic()
                failing_since = now if failing_since is None else failing_since
                if now - failing_since >= policy.give_up_seconds or self._closing.is_set():
                    raise
                recovery = recovery_for(error, policy)
                if recovery is Recovery.REJOIN:
                    try:
                        self._rejoin(index, session)
                    except grpc.RpcError as join_error:
                        error, recovery = join_error, recovery_for(join_error, policy)
                        if recovery not in RESEND:
                            raise
                    else:
                        continue
                if recovery in (Recovery.RECONNECT, Recovery.FOLLOW):
                    self._switch(index, session, error, recovery, now - started, now - failing_since)
                elif recovery is not Recovery.RETRY:
                    raise
                else:
                    _LOGGER.info(
                        "%s: shard %d: %s (%s); retrying", self.name, index, error.code().name, error.details()
                    )
                self.stats.retries += 1
            unanswered = unanswered + 1 if recovery is Recovery.RECONNECT else 0
            backoff = self._pause(recovery, unanswered, index, backoff, failing_since)

    def _pause(self, recovery: Recovery, unanswered: int, index: int, backoff: float, failing_since: float) -> float:
        """Wait before a call is sent again: the short fixed pause of a move to another replica
        (:func:`psworker.sessions.quick_pause`), else ``backoff`` (within the retry budget); returns
        the next backoff."""
        pause = quick_pause(recovery, unanswered, len(self.replicas[index]))
        if pause is not None:
            time.sleep(pause)
            return backoff
        remaining = failing_since + self.retry.give_up_seconds - time.monotonic()
        time.sleep(min(backoff, max(0.0, remaining)) * random.uniform(0.5, 1.0))
        return min(self.retry.max_backoff, backoff * self.retry.multiplier)

    def _switch(
        self,
        index: int,
        stale: ShardSession,
        error: grpc.RpcError,
        recovery: Recovery,
        call_seconds: float,
        failing_seconds: float,
    ) -> None:
        """Replace the connection of a call that got no answer, or that a replica refused for not
        being the primary: a new channel, to the same server or another replica of the shard's set
        (:func:`psworker.sessions.next_address`), the old one closed.

        The worker's record on the shard is kept (it is not tied to a connection, and the primary
        of a replica set holds it on every replica); if the shard lost it meanwhile, the next
        call's UNKNOWN_WORKER re-joins with resume."""
        address = next_address(recovery, error, self.replicas[index], stale.address)
        if recovery is Recovery.FOLLOW and address == stale.address:
            return  # a lone replica that knows no primary yet: it answered, so its connection is kept
        with self._session_lock:
            if self.sessions[index] is not stale:
                return  # another thread already replaced it
            self.sessions[index] = stale.on_channel(self._channel(address), address)
            if recovery is Recovery.RECONNECT:
                self.stats.reconnects += 1
            if address != stale.address:
                self.stats.follows += 1
        # Cancels whatever else was still waiting on the old connection; those calls retry on the new one.
        close_channel(stale.channel)
        budget = self.retry.give_up_seconds
        note = reconnect_note(index, stale.address, address, error, call_seconds, failing_seconds, budget)
        _LOGGER.warning("%s: %s", self.name, note)

    @property
    def rollbacks(self) -> list[Rollback]:
        return self.stats.rollbacks

    @property
    def rule(self) -> ps_pb2.RuleInfo:
        return self.sessions[0].join.rule

    @property
    def initialized(self) -> bool:
        return all(s.join.initialized for s in self.sessions)

    def _fan_out(self, call: Callable[..., ResultT], *args: object) -> list[ResultT]:
        """Run ``call(session, *args)`` for every shard concurrently, each with retries; re-raises the first error."""
        return fan_out(
            self._pool,
            [partial(self._call, index, lambda session: call(session, *args)) for index in range(len(self.sessions))],
        )

    # -- parameters -------------------------------------------------------------------

    def init(self, flat: torch.Tensor) -> bool:
        """Upload initial parameters; True if this upload set them (the first one wins)."""
        results = self._fan_out(self._init_shard, flat)
        return all(bool(r) for r in results)

    def _init_shard(self, session: ShardSession, flat: torch.Tensor) -> bool:
        header = ps_pb2.InitHeader(worker_id=session.worker_id, layout_hash=self.layout.hash)
        requests = transfer.init_requests(header, flat[session.range.span], self.push_encoder.chunk_bytes)
        timeout = self.deadlines.transfer(payload_bytes(session.range.length, codec.FLOAT32))
        reply: ps_pb2.InitResponse = session.data.init(requests, timeout=timeout, metadata=self._metadata)
        return reply.applied

    def pull(self, out: torch.Tensor, reserve: bool = False) -> int:
        """Pull every shard into ``out`` (flat fp32); returns the smallest shard clock.

        ``reserve`` (GEM's atomic mode) holds off other workers' pushes until this worker's next push.
        """
        self._fan_out(self._pull_shard, out, reserve)
        return self.clock

    @property
    def clock(self) -> int:
        """The smallest clock among the shards' last pulled parameters."""
        return min(self.pulled_clocks)

    def _pull_shard(self, session: ShardSession, out: torch.Tensor, reserve: bool = False) -> int:
        request = ps_pb2.PullRequest(worker_id=session.worker_id, wire_dtype=self.wire_dtype, reserve=reserve)
        timeout = self._held_deadline(session, self.wire_dtype)
        seen_when_sent = self.seen_clocks[session.range.index]
        messages = session.data.pull(request, timeout=timeout, metadata=self._metadata)
        clock = transfer.receive_params(messages, out[session.range.span])
        self.pulled_clocks[session.range.index] = clock
        shard_clock = pulled_shard_clock(clock, transfer.shard_clock(messages))
        self._observe_clock(session.range.index, shard_clock, seen_when_sent)
        return clock

    def push(
        self,
        flat: torch.Tensor,
        kind: ps_pb2.PayloadKind.ValueType = ps_pb2.PAYLOAD_KIND_GRADIENT,
        metadata: Mapping[str, float] | None = None,
        pull_into: torch.Tensor | None = None,
    ) -> list[PushResult]:
        """Push a flat update computed on the last pull, one result per shard.

        With ``pull_into`` the new parameters come back in the same round trip (PushPull).
        """
        with self._push_id_lock:
            push_id = self._next_push_id
            self._next_push_id += 1
        encoding = self.push_encoder.one_push(flat)  # each shard's chunks encoded once, whatever the retries
        results = self._fan_out(self._push_shard, encoding, push_id, kind, dict(metadata or {}), pull_into)
        return [r for r in results if isinstance(r, PushResult)]

    def _push_shard(
        self,
        session: ShardSession,
        encoding: OnePush,
        push_id: int,
        kind: ps_pb2.PayloadKind.ValueType,
        metadata: dict[str, float],
        pull_into: torch.Tensor | None,
    ) -> PushResult:
        index = session.range.index
        base_clock = self.pulled_clocks[index]
        header = ps_pb2.PushHeader(
            worker_id=session.worker_id,
            push_id=push_id,
            base_clock=base_clock,
            kind=kind,
            layout_hash=self.layout.hash,
            metadata=metadata,
            pull_dtype=self.wire_dtype,
        )
        try:
            result = self._send_push(session, header, encoding.chunks(session.range), pull_into)
        except grpc.RpcError as error:
            if not is_future_clock(error):
                raise
            # The shard restarted from a checkpoint older than the parameters this update was computed
            # on: send it against the shard's clock now (its true base is gone).
            clock = session.stub.Heartbeat(
                ps_pb2.HeartbeatRequest(worker_id=session.worker_id),
                timeout=self.deadlines.short(),
                metadata=self._metadata,
            ).clock
            self._observe_clock(index, clock)
            header.base_clock = min(base_clock, clock)
            result = self._send_push(session, header, encoding.chunks(session.range), pull_into)
        if result.duplicate:
            self.stats.duplicate_acks += 1
        # An acknowledgement only raises the clock seen: with PushPull the parameters that came back
        # may already be newer, and a rollback shows in the next pull (or heartbeat) anyway.
        self.seen_clocks[index] = max(self.seen_clocks[index], result.clock)
        return result

    def _send_push(
        self,
        session: ShardSession,
        header: ps_pb2.PushHeader,
        chunks: Iterable[codec.ChunkPayload],
        pull_into: torch.Tensor | None,
    ) -> PushResult:
        index = session.range.index
        if pull_into is None:
            timeout, unary = self._held_deadline(session, self.push_encoder.dtype), self.unary_pushes
            reply = transfer.push(session.data, header, chunks, timeout, self._metadata, unary, index)
            return PushResult.of(reply)
        timeout = self._held_deadline(session, self.push_encoder.dtype, self.wire_dtype)
        part, unary = pull_into[session.range.span], self.unary_push_pulls
        seen_when_sent = self.seen_clocks[index]
        ack, clock, call = transfer.push_pull(session.data, header, chunks, part, timeout, self._metadata, unary, index)
        self.pulled_clocks[index] = clock
        # A duplicate's acknowledgement repeats the clock of the first attempt: no longer the shard's.
        ack_clock = None if ack.duplicate else ack.clock
        self._observe_clock(index, pulled_shard_clock(clock, transfer.shard_clock(call), ack_clock), seen_when_sent)
        return PushResult.of(ack)

    def _held_deadline(self, session: ShardSession, *wire_dtypes: int) -> float:
        return self.deadlines.held(session.range.length, session.join.lease_seconds, *wire_dtypes)

    # -- housekeeping -----------------------------------------------------------------

    def heartbeat(self, stats: Mapping[str, float]) -> None:
        def beat(session: ShardSession) -> None:
            seen_when_sent = self.seen_clocks[session.range.index]
            reply: ps_pb2.HeartbeatResponse = session.stub.Heartbeat(
                ps_pb2.HeartbeatRequest(worker_id=session.worker_id, stats=dict(stats)),
                timeout=self.deadlines.short(),
                metadata=self._metadata,
            )
            self._observe_clock(session.range.index, reply.clock, seen_when_sent)

        for index in range(len(self.sessions)):
            self._call(index, beat)

    def status(self) -> list[ps_pb2.StatusResponse]:
        return [
            self._call(
                i,
                lambda s: s.stub.Status(
                    ps_pb2.StatusRequest(), timeout=self.deadlines.short(), metadata=self._metadata
                ),
            )
            for i in range(len(self.sessions))
        ]

    def checkpoint(self) -> list[ps_pb2.CheckpointResponse]:
        """Ask every shard to write a checkpoint now (admin)."""
        return [
            s.stub.Checkpoint(
                ps_pb2.CheckpointRequest(),
                timeout=self.deadlines.transfer(_CHECKPOINT_COPIES * payload_bytes(s.range.length, codec.FLOAT32)),
                metadata=self._metadata,
            )
            for s in self.sessions
        ]

    def leave(self) -> None:
        """Leave every shard (best effort) and close the channels."""
        self.close()

    def close(self, leave: bool = True) -> None:
        """Leave every shard (best effort) and close the channels."""
        self._closing.set()
        for session in self.sessions:
            if leave:
                # The server may already be gone; leaving is a courtesy.
                with contextlib.suppress(grpc.RpcError):
                    session.stub.Leave(
                        ps_pb2.LeaveRequest(worker_id=session.worker_id),
                        timeout=LEAVE_TIMEOUT_S,
                        metadata=self._metadata,
                    )
            close_channel(session.channel)
        self._pool.shutdown(wait=False)

    def __enter__(self) -> PSClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
