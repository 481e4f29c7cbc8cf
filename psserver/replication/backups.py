"""The primary's side of replication: its state sent to every backup, and acknowledgements held
until every in-sync backup holds the state they are part of.

Every change of the shard (a push or BSP round applied, a worker joined or gone, an Init) is one
more *version*. A backup's link sends the newest state whenever the backup holds an older version
than the shard's: one state covers every change since the last it acknowledged, so under many
workers one transfer carries many pushes. A push is acknowledged to its worker (``settled``) once
every in-sync backup holds a version at least as new as the shard's when the push was applied,
and only while this replica's lease is valid.

A backup that fails or does not answer within its timeout leaves the in-sync set, and the set is
written to etcd *before* anything is acknowledged without it; one that holds the newest version
again is written back in. Every state carries the epoch; a backup that knows a newer one answers
STALE_EPOCH, and this primary steps down.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import torch

from psproto import wire
from psproto.errors import Reason, reason_of
from psproto.security import ClientTls, open_channel
from psproto.v1 import ps_pb2
from psserver.core import shard_state
from psserver.core.errors import ErrorKind, ShardError
from psserver.core.observer import NullObserver
from psserver.core.shard import Shard
from psserver.core.workers import WorkerRecord
from psserver.replication import state_wire
from psserver.replication.config import ReplicationConfig
from psserver.replication.coordinator import Coordinator, EtcdError, PrimaryRecord
from psserver.replication.standby import DATA_FIELD, REPLICA_SERVICE

_LOGGER = logging.getLogger(__name__)
# A state's transfer may take its timeout plus its bytes at this rate (a large shard is not a slow backup).
MIN_TRANSFER_BYTES_PER_S = 100e6
RETRY_PAUSE_S = 0.2
# gRPC says only "Socket closed" when the other side refused this replica's certificate.
TLS_HINT = (
    " (with TLS, each replica must trust the CA of the others' certificates, --tls-client-ca, and each"
    " certificate name the address its replica advertises)"
)
# The state travels in pieces this large: gRPC's Python layer costs something per message, so a
# ResNet-18 shard (45 MB) goes in three messages rather than 45 (the step with one backup is
# ``python -m benchmarks.replication``'s cost section). A server takes messages of up to 64 MiB
# (transport.max_message_bytes), and the backup is a server of the same build.
REPLICATION_CHUNK_BYTES = 16 * 1024 * 1024
REPLICATE_METHOD = f"/{REPLICA_SERVICE}/Replicate"


class StateVersions(NullObserver):
    """Counts the shard's changes; its events come under the shard's lock, so a version read
    before a state is captured is never newer than that state."""

    def __init__(self) -> None:
        self.version = 0
        self._lock = threading.Lock()  # Init's change comes outside the shard's lock
        self._times: collections.deque[tuple[int, float]] = collections.deque()
        self.on_change: Callable[[], None] = lambda: None

    def changed(self) -> None:
        with self._lock:
            self.version += 1
            self._times.append((self.version, time.monotonic()))
        self.on_change()

    def changed_at(self, version: int) -> float | None:
        """When version ``version`` was made (None once forgotten or not made yet)."""
        with self._lock:
            return next((at for made, at in self._times if made >= version), None)

    def forget_before(self, version: int) -> None:
        with self._lock:
            while self._times and self._times[0][0] < version:
                self._times.popleft()

    def worker_joined(self, worker: WorkerRecord) -> None:
        self.changed()

    def worker_left(self, worker: WorkerRecord, evicted: bool) -> None:
        self.changed()

    def update_committed(self, clock: int, capture_state: Callable[[], dict[str, Any]]) -> None:
        self.changed()


@dataclass
class SentState:
    version: int
    encoded: state_wire.EncodedState
    digest: str  # "" when this one carries none
    staging: int  # which set of staging buffers holds its tensors (-1: its own)
    senders: int = 0  # links sending it now


class _Staging:
    """Two sets of buffers the captured tensors are copied into, used in turn: a copy into memory
    already touched costs a fraction of a fresh allocation's (page faults), and a set still being
    sent is never written."""

    def __init__(self) -> None:
        self._sets: list[dict[str, torch.Tensor]] = [{}, {}]

    def copier(self, index: int) -> Callable[[str, torch.Tensor], torch.Tensor]:
        buffers = self._sets[index]

        def copy(key: str, tensor: torch.Tensor) -> torch.Tensor:
            kept = buffers.get(key)
            if kept is None or kept.shape != tensor.shape or kept.dtype != tensor.dtype:
                kept = buffers[key] = torch.empty_like(tensor, memory_format=torch.contiguous_format)
            return kept.copy_(tensor.detach())

        return copy


@dataclass(frozen=True)
class PeerAccess:
    """How a replica calls another: TLS (None: plaintext) and the metadata each call carries (the
    bearer token), both those the replica's own server asks of its callers."""

    tls: ClientTls | None = None
    metadata: tuple[tuple[str, str], ...] = ()

    def channel(self, address: str) -> grpc.Channel:
        # A state goes in messages of REPLICATION_CHUNK_BYTES; the backup's server bounds what it takes.
        return open_channel(address, self.tls, options=[("grpc.max_send_message_length", -1)])


@dataclass
class BackupView:
    name: str
    address: str
    in_sync: bool
    lag_versions: int
    lag_bytes: int
    lag_seconds: float


class _Link:
    """One backup: a thread that sends it the newest state whenever it holds an older one."""

    def __init__(self, owner: Replicator, name: str, address: str) -> None:
        self.owner, self.name, self.address = owner, name, address
        self.acked = -1  # the version it holds (-1: none yet)
        self.in_sync = False
        # Set once it answered a state outside the in-sync set: the newest version acknowledged then.
        # From then on acknowledgements wait for it too; once it holds that version it holds every
        # one acknowledged, and is written into the in-sync set.
        self.joining_from: int | None = None
        self.stopped = False
        # Why its last transfer failed (None: it did not): a new reason is logged once, not every retry.
        self.problem: str | None = None
        self._channel = owner.peers.channel(address)
        self._replicate = self._channel.stream_unary(
            REPLICATE_METHOD, request_serializer=None, response_deserializer=ps_pb2.ReplicateResponse.FromString
        )
        self._thread = threading.Thread(target=self._run, name=f"replicate-{name}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopped = True
        self.owner.wake()
        self._channel.close()

    def _run(self) -> None:
        while not self.stopped:
            sent = self.owner.newest_after(self.acked, lambda: self.stopped)
            if sent is None:
                return
            try:
                reply = self._send(sent)
            except grpc.RpcError as error:
                if self.stopped:
                    return
                if reason_of(error) is Reason.STALE_EPOCH:
                    self.owner.fenced(f"backup {self.name} knows a newer epoch: {error.details()}")
                    return
                self.owner.failed(self, f"{error.code().name}: {error.details()}")
                time.sleep(RETRY_PAUSE_S)
                continue
            self.owner.acknowledged(self, sent, reply)

    def _send(self, sent: SentState) -> ps_pb2.ReplicateResponse:
        owner = self.owner
        header = ps_pb2.ReplicateHeader(
            epoch=owner.record.epoch,
            version=sent.version,
            clock=sent.encoded.clock,
            primary=owner.record.name,
            total_bytes=sent.encoded.total_bytes,
            digest=sent.digest,
        )
        timeout = owner.config.ack_timeout_seconds + sent.encoded.total_bytes / MIN_TRANSFER_BYTES_PER_S
        try:
            reply: ps_pb2.ReplicateResponse = self._replicate(
                _messages(header, sent.encoded, owner.chunk_bytes), timeout=timeout, metadata=owner.peers.metadata
            )
        finally:
            owner.sent(sent)
        return reply


def _messages(header: ps_pb2.ReplicateHeader, encoded: state_wire.EncodedState, chunk: int) -> Iterator[bytes]:
    """The Replicate stream as serialised ReplicateRequests (one copy of the state, into them)."""
    yield ps_pb2.ReplicateRequest(header=header).SerializeToString()
    for part in encoded.parts:
        for start in range(0, part.nbytes, chunk):
            yield wire.length_delimited(DATA_FIELD, part[start : start + chunk])


class Replicator:
    """The primary's backups, and the acknowledgements that wait for them."""

    def __init__(
        self,
        shard: Shard,
        coordinator: Coordinator,
        record: PrimaryRecord,
        on_fenced: Callable[[str], None],
        peers: PeerAccess | None = None,
    ) -> None:
        self.shard, self.coordinator, self.record = shard, coordinator, record
        self.config: ReplicationConfig = coordinator.config
        self.chunk_bytes = REPLICATION_CHUNK_BYTES
        self.peers = peers or PeerAccess()
        self._on_fenced = on_fenced
        self.versions = StateVersions()
        self._cond = threading.Condition()
        self.versions.on_change = self._changed
        self._unsubscribe = shard.subscribe(self.versions)
        self._links: dict[str, _Link] = {}
        self._sent: SentState | None = None
        self._capture = threading.Lock()
        self._staging = _Staging()
        self._in_staging: dict[int, SentState] = {}
        self._digested = 0
        self.digest_mismatches = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        # The newest version any acknowledgement waited for (guarded by ``_cond``).
        self._acknowledged_up_to = 0
        self._closed = False

    # -- the links -------------------------------------------------------------------------------

    def follow_replicas(self, replicas: Mapping[str, str]) -> None:
        """Keep one link per live replica other than this one (the registrations in etcd)."""
        others = {name: address for name, address in replicas.items() if name != self.record.name}
        with self._cond:
            if self._closed:
                return
            gone = [link for name, link in self._links.items() if others.get(name) != link.address]
            for link in gone:
                del self._links[link.name]
            for name, address in others.items():
                if name not in self._links:
                    _LOGGER.info("backup %s at %s: sending it the state", name, address)
                    self._links[name] = _Link(self, name, address)
        for link in gone:
            link.stop()
            if link.in_sync:
                self._shrink(link, "its registration in etcd is gone")

    def close(self, reason: str) -> None:
        """Stop every link and end every waiting acknowledgement with NOT_PRIMARY."""
        with self._cond:
            self._closed = True
            links = list(self._links.values())
            self._links.clear()
            self._cond.notify_all()
        for link in links:
            link.stop()
        self._unsubscribe()
        _LOGGER.warning("replication stopped: %s", reason)
        self._notify_loop()

    def _changed(self) -> None:
        """A new version: the links wake; the times of versions every backup holds are forgotten
        (all of them when there is no backup), so they never pile up."""
        with self._cond:
            held_by_all = min((link.acked for link in self._links.values()), default=self.versions.version)
            self._cond.notify_all()
        self.versions.forget_before(held_by_all + 1)

    def wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def newest_after(self, version: int, stopped: Callable[[], bool]) -> SentState | None:
        """The newest state once the shard is past ``version`` (captured once per version for
        every link); None once stopped."""
        with self._cond:
            while not stopped() and not self._closed and self.versions.version <= version:
                self._cond.wait(1.0)
            if stopped() or self._closed:
                return None
        with self._capture:
            sent = self._sent
            if sent is None or sent.version <= version:
                current = self.versions.version  # read before the capture: the state is at least this new
                staging = self._free_staging()
                copy = self._staging.copier(staging) if staging >= 0 else shard_state.clone
                encoded = state_wire.encode(self.shard.state_dict(copy))
                digest = ""
                if current - self._digested >= self.config.digest_every:
                    digest, self._digested = encoded.digest(), current
                sent = self._sent = SentState(current, encoded, digest, staging)
            sent.senders += 1
            self._in_staging[sent.staging] = sent
            return sent

    def _free_staging(self) -> int:
        """A set of staging buffers no link is sending from and the newest state is not in (-1: none)."""
        newest = self._sent.staging if self._sent is not None else -1
        for index in (0, 1):
            holder = self._in_staging.get(index)
            if index != newest and (holder is None or holder.senders == 0):
                return index
        return -1

    def sent(self, state: SentState) -> None:
        with self._capture:
            state.senders -= 1

    # -- what the links report -------------------------------------------------------------------

    def acknowledged(self, link: _Link, sent: SentState, reply: ps_pb2.ReplicateResponse) -> None:
        if reply.digest_checked and not reply.digest_matches:
            self.digest_mismatches += 1
            _LOGGER.error("backup %s holds version %d with another digest", link.name, sent.version)
        link.problem = None
        with self._cond:
            link.acked = max(link.acked, sent.version)
            # Under continuous pushes a backup never holds the newest version when its answer comes:
            # it joins the waits first, so the versions acknowledged stop running ahead of it.
            if not link.in_sync and link.joining_from is None:
                link.joining_from = self._acknowledged_up_to
            joins = link.joining_from is not None and link.acked >= link.joining_from
        if joins:
            self._grow(link)
        self._notify_loop()

    def failed(self, link: _Link, why: str) -> None:
        if link.in_sync:
            self._shrink(link, why)
            return
        with self._cond:
            link.joining_from = None
        self._notify_loop()
        if why != link.problem:
            # A backup that never takes the state (a TLS or token mismatch, a firewall) says why.
            hint = TLS_HINT if self.peers.tls is not None else ""
            _LOGGER.warning("backup %s at %s cannot take the state: %s%s", link.name, link.address, why, hint)
        link.problem = why

    def fenced(self, why: str) -> None:
        self._on_fenced(why)

    def _in_sync_names(self) -> list[str]:
        return [self.record.name] + [name for name, link in self._links.items() if link.in_sync]

    def _grow(self, link: _Link) -> None:
        with self._cond:
            names = [*self._in_sync_names(), link.name]
        if self._write_in_sync(names):
            with self._cond:
                link.in_sync, link.joining_from = True, None
            _LOGGER.info("backup %s is in sync (version %d)", link.name, link.acked)

    def _shrink(self, link: _Link, why: str) -> None:
        """Take ``link`` out of the in-sync set, in etcd first: until that is written nothing is
        acknowledged without it (the waits go on)."""
        while not self._closed:
            with self._cond:
                names = [name for name in self._in_sync_names() if name != link.name]
            if self._write_in_sync(names):
                link.in_sync = False
                _LOGGER.warning("backup %s left the in-sync set: %s", link.name, why)
                self._notify_loop()
                return
            time.sleep(RETRY_PAUSE_S)

    def _write_in_sync(self, names: list[str]) -> bool:
        try:
            if self.coordinator.set_in_sync(self.record, names):
                return True
        except EtcdError as error:
            _LOGGER.warning("cannot write the in-sync set to etcd: %s", error)
            return False
        self.fenced("the primary key in etcd is no longer this replica's")
        return False

    # -- acknowledgements, on the server's event loop ----------------------------------------------

    def start_at(self, version: int) -> None:
        """Count versions on from ``version`` (the last this replica held): all of it may have been
        acknowledged by the primary before."""
        with self._cond:
            self.versions.version = self._acknowledged_up_to = version

    def _settle(self, target: int) -> bool:
        """Whether version ``target`` may be acknowledged now (every in-sync or joining backup holds
        it); if so, it counts as acknowledged from now on (a joining backup must hold it)."""
        with self._cond:
            waited_for = [link for link in self._links.values() if link.in_sync or link.joining_from is not None]
            held = all(link.acked >= target for link in waited_for)
            if held:
                self._acknowledged_up_to = max(self._acknowledged_up_to, target)
            return held

    async def settled(self) -> None:
        """Return once every in-sync backup holds the shard's current version and this replica
        may still acknowledge; else raise NOT_PRIMARY."""
        target = self.versions.version
        if not self._settle(target) and not self._closed:
            loop = asyncio.get_running_loop()
            self._loop = loop
            future: asyncio.Future[None] = loop.create_future()
            self._waiters.append((target, future))
            self._wake_waiters()  # an acknowledgement may have come in meanwhile
            await future
        if self._closed or not self.coordinator.lease_valid():
            raise ShardError(
                ErrorKind.NOT_PRIMARY,
                "this replica is no longer the shard's primary (its lease ran out); send the call to the new one",
                metadata={"primary": "", "epoch": ""},
            )

    def _notify_loop(self) -> None:
        loop = self._loop
        # Closed (the server stopped): nothing waits any more.
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closed meanwhile
                loop.call_soon_threadsafe(self._wake_waiters)

    def _wake_waiters(self) -> None:
        keep = []
        for target, future in self._waiters:
            if future.done():
                continue
            if self._closed or self._settle(target):
                future.set_result(None)
            else:
                keep.append((target, future))
        self._waiters = keep

    # -- what status and metrics show ------------------------------------------------------------

    def backups(self) -> list[BackupView]:
        now = time.monotonic()
        sent = self._sent
        size = sent.encoded.total_bytes if sent is not None else 0
        with self._cond:
            current = self.versions.version
            views = []
            for link in self._links.values():
                behind = max(0, current - max(link.acked, 0))
                made = self.versions.changed_at(link.acked + 1) if behind else None
                views.append(
                    BackupView(
                        link.name,
                        link.address,
                        link.in_sync,
                        behind,
                        size if behind else 0,
                        now - made if made is not None else 0.0,
                    )
                )
        return views
