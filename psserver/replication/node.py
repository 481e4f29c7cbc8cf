"""One replica of a shard over time: a candidate, then a backup or the primary, until deposed.

A thread renews this process's etcd lease (every quarter of it) and reads the shard's keys at each
change etcd's watch tells of, and every ``poll_seconds`` besides. A replica that is not primary
follows the one etcd names, holds what it sends (``standby``) and, once no primary holds the key and
it may take over (``ShardKeys.may_take_over``), campaigns; the winner installs the state it holds
(or, when every in-sync replica is gone, the newest checkpoint) into its shard and opens its gate. A
primary that lost its lease, could not renew it in time, saw another primary in etcd or was told of
a newer epoch steps down: its gate closes at once (nothing more is acknowledged) and ``on_deposed``
ends the process, whose restart comes back as a backup with an empty shard.

The gate: every ParameterServer call but Status on a replica that is not a serving primary is
refused with NOT_PRIMARY, naming the primary etcd names (empty during an election).
"""

from __future__ import annotations

import enum
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from psproto.errors import Reason
from psproto.reasons import EPOCH_KEY, PRIMARY_KEY
from psproto.v1 import ps_pb2
from psserver.core.errors import ErrorKind, ShardError
from psserver.core.shard import Shard, StateError
from psserver.replication.backups import BackupView, PeerAccess, Replicator
from psserver.replication.coordinator import Coordinator, EtcdError, KeyWatch, PrimaryRecord, ShardKeys
from psserver.replication.standby import Standby
from psserver.rpc.status_codes import refusal

_LOGGER = logging.getLogger(__name__)
# Status is answered by every replica: it says which one is primary.
_UNGATED = ("Status",)


class Role(str, enum.Enum):
    CANDIDATE = "candidate"  # started, not yet placed by an election
    BACKUP = "backup"
    PRIMARY = "primary"
    DEPOSED = "deposed"  # stepped down; the process ends


@dataclass(frozen=True)
class ReplicaView:
    """One replica as ``psserver status``, ``top`` and the metrics show it."""

    role: Role
    epoch: int
    name: str
    address: str
    primary: str
    version: int
    clock: int  # of the state it holds: a primary's shard's, a backup's last received
    in_sync: bool
    failovers: int
    digest_mismatches: int
    backups: list[BackupView] = field(default_factory=list)


@dataclass(frozen=True)
class NodeParts:
    """What a replica works with besides etcd: its shard, how to restore it when nothing else
    holds its state, how it calls the other replicas, what ends the process."""

    shard: Shard
    # Restores the newest checkpoint into the shard (none: it stays empty); StateError when unusable.
    restore_checkpoint: Callable[[Shard], None]
    # The newest checkpoint's clock (None: none).
    checkpoint_clock: Callable[[], int | None]
    on_deposed: Callable[[str], None]
    peers: PeerAccess = field(default_factory=PeerAccess)


class ReplicaNode:
    def __init__(self, coordinator: Coordinator, parts: NodeParts) -> None:
        self.coordinator = coordinator
        self.parts = parts
        self.role = Role.CANDIDATE
        self.record: PrimaryRecord | None = None  # this replica's, while primary
        self.known_primary: PrimaryRecord | None = None
        self.in_sync = False
        self.failovers = 0
        self.standby = Standby(lambda: self.role is Role.PRIMARY)
        self.replicator: Replicator | None = None
        self._stop = threading.Event()
        # Set by etcd's watch at every change of the shard's keys (and by stop): the thread reads them then.
        self._changed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="replica-node", daemon=True)

    @staticmethod
    def unique_name(address: str) -> str:
        """A name for this process: a restarted one is another replica (it holds nothing yet)."""
        return f"{address}/{uuid.uuid4().hex[:8]}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """A clean stop: a primary resigns so a backup takes over without waiting for the lease."""
        self._stop.set()
        self._changed.set()
        self._thread.join(timeout=5)
        if self.role is Role.PRIMARY and self.record is not None:
            self._close_gate("stopping")
            self.coordinator.resign(self.record)
        self.coordinator.revoke()

    # -- the gate and what acknowledgements wait for ----------------------------------------------

    def serving(self) -> bool:
        return self.role is Role.PRIMARY and self.coordinator.lease_valid()

    def admission(self, method: str) -> grpc.Status | None:
        """None when ``method`` may run here; else the NOT_PRIMARY refusal naming the primary."""
        if method in _UNGATED or self.serving():
            return None
        primary = self._other_primary()
        if primary is not None:
            where = f"the primary is {primary.address} (epoch {primary.epoch})"
        elif self.known_primary is not None and self.known_primary.name != self.coordinator.name:
            where = "etcd names the process this one replaced at its address: no primary until that one's lease ends"
        else:
            where = "no primary yet"
        return refusal(
            Reason.NOT_PRIMARY,
            f"{method} refused: this replica ({self.role.value}) is not the shard's primary; {where}",
            {
                PRIMARY_KEY: primary.address if primary else "",
                EPOCH_KEY: str(primary.epoch) if primary else "",
            },
        )

    def _other_primary(self) -> PrimaryRecord | None:
        """The primary etcd names when it is another process that may be alive: not this one, and not
        the one this process replaced at its address (restarted before that one's lease ended), so
        that a worker is never sent back here."""
        primary = self.known_primary
        return None if primary is None or primary.address == self.coordinator.address else primary

    def view(self) -> ReplicaView:
        held = self.standby.held
        replicator = self.replicator
        primary = self.known_primary if self.role is Role.PRIMARY else self._other_primary()
        return ReplicaView(
            role=self.role,
            epoch=max(self.standby.known_epoch, self.record.epoch if self.record else 0),
            name=self.coordinator.name,
            address=self.coordinator.address,
            primary=primary.address if primary else "",
            version=replicator.versions.version if replicator else (held.version if held else 0),
            clock=self.parts.shard.clock if replicator else (held.clock if held else 0),
            in_sync=self.in_sync,
            failovers=self.failovers,
            digest_mismatches=(replicator.digest_mismatches if replicator else 0) + self.standby.digest_mismatches,
            backups=replicator.backups() if replicator else [],
        )

    # -- the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        config = self.coordinator.config
        renew_every = config.lease_seconds / 4
        renewed = read = 0.0
        watch: KeyWatch | None = None
        try:
            while not self._stop.is_set() and self.role is not Role.DEPOSED:
                try:
                    if time.monotonic() - renewed >= renew_every:
                        self._renew()
                        renewed = time.monotonic()
                    if self._changed.is_set() or time.monotonic() - read >= config.poll_seconds:
                        self._changed.clear()  # before the read: a change during it is read again
                        read = time.monotonic()
                        self._follow(self.coordinator.read())
                    watch = self._watching(watch)
                except EtcdError as error:
                    _LOGGER.debug("etcd: %s", error)
                    if self.role is Role.PRIMARY and not self.coordinator.lease_valid():
                        self._step_down("cut off from etcd for longer than the lease")
                next_due = min(renewed + renew_every, read + config.poll_seconds)
                self._changed.wait(max(0.0, next_due - time.monotonic()))
        finally:
            if watch is not None:
                watch.close()

    def _watching(self, watch: KeyWatch | None) -> KeyWatch:
        """``watch`` while it lives; else a new one, started now that etcd has just answered a read."""
        if watch is not None and watch.alive:
            return watch
        if watch is not None:
            watch.close()
        return self.coordinator.watch(self._changed)

    def _renew(self) -> None:
        if self.coordinator.renew():
            return
        if self.role is Role.PRIMARY:
            self._step_down("its etcd lease expired")
            return
        self.coordinator.grant()  # a backup paused past its lease registers again (out of sync)
        self.in_sync = False

    def _follow(self, keys: ShardKeys) -> None:
        self.standby.saw_epoch(keys.epoch)
        self.known_primary = keys.primary
        name = self.coordinator.name
        if self.role is Role.PRIMARY:
            if keys.primary is None or keys.primary.name != name:
                self._step_down("etcd names another primary" if keys.primary else "its primary key is gone")
            elif self.replicator is not None:
                self.replicator.follow_replicas(keys.replicas)
            return
        self.in_sync = keys.in_sync is not None and name in keys.in_sync
        if keys.primary is not None:
            self.role = Role.BACKUP
            return
        if keys.may_take_over(name):
            record = self.coordinator.campaign(keys)
            if record is not None:
                self._promote(record, keys)

    def _promote(self, record: PrimaryRecord, keys: ShardKeys) -> None:
        held = self.standby.take()
        shard = self.parts.shard
        unclean = keys.in_sync is not None and self.coordinator.name not in keys.in_sync
        if unclean:
            # What only the lost replicas held is gone; the newer of what is left is taken.
            newest = self.parts.checkpoint_clock()
            if held is not None and newest is not None and newest > held.clock:
                held = None
            _LOGGER.error(
                "every replica in sync (%s) is gone: this one starts from %s; acknowledged pushes after it are lost",
                ", ".join(keys.in_sync or ()),
                f"the state it held (clock {held.clock})" if held else f"its newest checkpoint (clock {newest})",
            )
        try:
            if held is not None:
                shard.load_state_dict(held.state)
            else:
                self.parts.restore_checkpoint(shard)
        except StateError as error:
            _LOGGER.error("cannot take over the shard: %s", error)
            self.coordinator.resign(record)
            self._depose(f"its state could not be installed: {error}")
            return
        self.record = record
        self.known_primary = record
        self.in_sync = True
        self.failovers += 1 if record.epoch > 1 else 0
        self.replicator = Replicator(shard, self.coordinator, record, self._step_down, self.parts.peers)
        # Versions go on from the last this replica held, so a backup's and its primary's compare.
        self.replicator.start_at(held.version if held is not None else 0)
        self.role = Role.PRIMARY
        _LOGGER.warning(
            "primary of shard %s at epoch %d (clock %d, from %s)",
            self.coordinator.prefix,
            record.epoch,
            shard.clock,
            f"version {held.version} sent by {held.primary}" if held else "its checkpoint",
        )

    def _close_gate(self, why: str) -> None:
        self.role = Role.DEPOSED
        if self.replicator is not None:
            self.replicator.close(why)

    def _step_down(self, why: str) -> None:
        if self.role is not Role.PRIMARY:
            return
        _LOGGER.error("stepping down as primary: %s; nothing more is acknowledged here", why)
        self._depose(why)

    def _depose(self, why: str) -> None:
        self._close_gate(why)
        self.parts.on_deposed(why)


def _not_primary(why: str) -> ShardError:
    return ShardError(
        ErrorKind.NOT_PRIMARY,
        f"this replica is not the shard's primary ({why}); send the call to the primary",
        metadata={PRIMARY_KEY: "", EPOCH_KEY: ""},
    )


class NodeHooks:
    """``psserver.rpc.replication_hooks.Replication`` for a replica."""

    def __init__(self, node: ReplicaNode) -> None:
        self.node = node

    def admission(self, method: str) -> grpc.Status | None:
        return self.node.admission(method)

    async def settled(self, changed: bool = False) -> None:
        replicator = self.node.replicator
        if replicator is None or self.node.role is not Role.PRIMARY:
            raise _not_primary(self.node.role.value)
        if changed:
            replicator.versions.changed()
        await replicator.settled()

    def status(self) -> ps_pb2.ReplicaStatus:
        view = self.node.view()
        return ps_pb2.ReplicaStatus(
            role=view.role.value,
            epoch=view.epoch,
            name=view.name,
            address=view.address,
            primary=view.primary,
            version=view.version,
            clock=view.clock,
            in_sync=view.in_sync,
            failovers=view.failovers,
            digest_mismatches=view.digest_mismatches,
            backups=[
                ps_pb2.BackupStatus(
                    name=b.name,
                    address=b.address,
                    in_sync=b.in_sync,
                    lag_versions=b.lag_versions,
                    lag_bytes=b.lag_bytes,
                    lag_seconds=b.lag_seconds,
                )
                for b in view.backups
            ],
        )
