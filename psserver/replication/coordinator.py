"""A shard's replicas and their primary, as keys in etcd (its v3 JSON gateway, through etcd3gw).

Under ``/hetps/<job>/shard/<index>/``:

- ``primary``: the primary's name, address and epoch, bound to the primary's lease: it vanishes
  when the primary stops renewing it (dead, paused, cut off from etcd).
- ``epoch``: the last epoch taken; a new primary takes the next one in the same transaction that
  creates ``primary``, so two primaries never share an epoch.
- ``in_sync``: the replicas that hold every acknowledged push. The primary rewrites it (only while
  ``primary`` is still its own) before it acknowledges anything without a backup that fell behind,
  and after a backup caught up. Only a replica named in it may become primary, unless every one of
  them is gone (then the shard is restored from a checkpoint: nothing newer survives anywhere).
- ``replicas/<name>``: each live replica's address, bound to its own lease.

Each process holds one lease of ``lease_seconds``, renewed every quarter of it. ``valid_until``
is when the lease may have run out at etcd for all this process knows (the last renewal's send
time plus the lease, less a margin): a primary acknowledges nothing past it.

A replica learns of a change of these keys from etcd's watch of the prefix (``KeyWatch``), at
once, and reads them again; it also reads them every ``poll_seconds`` whatever the watch says, so
a watch that broke silently costs at most that long.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from base64 import b64encode
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from psserver.replication.config import EtcdTls, ReplicationConfig

if TYPE_CHECKING:
    from etcd3gw.client import Etcd3Client

_LOGGER = logging.getLogger(__name__)
# What the replica trusts less than etcd's own clock: scheduling and clock-rate differences.
LEASE_MARGIN_S = 0.25
# A request to etcd that takes longer than this is a failure (a partition must be noticed in time).
REQUEST_TIMEOUT_S = 0.5


class EtcdError(Exception):
    """etcd could not be asked (no endpoint answered in time) or refused the request."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        # Every endpoint was reached but none answered in time (a busy etcd, not a wrong address).
        self.timed_out = timed_out


class KeyWatch:
    """etcd's watch of a key prefix, read on a thread of its own: ``changed`` is set at every event,
    and once the stream ends (etcd gone, the connection cut), after which ``alive`` is False."""

    def __init__(self, response: Any, changed: threading.Event) -> None:
        self._response = response
        self._changed = changed
        self.alive = True
        threading.Thread(target=self._read, name="etcd-watch", daemon=True).start()

    def _read(self) -> None:
        try:
            for line in self._response.iter_lines():
                if line:  # the watch's creation, then its events; either way the keys are read again
                    self._changed.set()
        except Exception as error:  # requests' and urllib3's errors alike end the stream
            _LOGGER.debug("etcd's watch ended: %s", _detail(error))
        finally:
            self.alive = False
            self._changed.set()

    def close(self) -> None:
        self.alive = False
        # The reader is blocked in a read: shut the socket down under it, or closing waits for it.
        connection = getattr(self._response.raw, "connection", None)
        sock = getattr(connection, "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._response.close()


def _encode(text: str) -> str:
    return b64encode(text.encode()).decode()


@dataclass(frozen=True)
class PrimaryRecord:
    name: str
    address: str
    epoch: int

    def value(self) -> str:
        return json.dumps({"name": self.name, "address": self.address, "epoch": self.epoch}, sort_keys=True)


@dataclass(frozen=True)
class ShardKeys:
    """What etcd holds about one shard, read at one revision."""

    primary: PrimaryRecord | None = None
    epoch: int = 0
    epoch_revision: int = 0
    in_sync: tuple[str, ...] | None = None  # None: never written (a new shard)
    in_sync_revision: int = 0
    replicas: dict[str, str] = field(default_factory=dict)  # name -> address

    def may_take_over(self, name: str) -> bool:
        """Whether replica ``name`` may become primary now: nobody is, and it is in sync, or the
        shard is new, or every replica that was in sync is gone."""
        if self.primary is not None:
            return False
        if self.in_sync is None or name in self.in_sync:
            return True
        return not any(member in self.replicas for member in self.in_sync)


class Coordinator:
    """One replica's view of etcd: its lease, its registration, the election, the in-sync set."""

    def __init__(self, config: ReplicationConfig, shard_index: int, name: str = "", address: str = "") -> None:
        """``name`` and ``address`` may come later (``place``), once the server knows its port."""
        self.config = config
        self.name = name
        self.address = address
        self.prefix = f"/hetps/{config.job}/shard/{shard_index}/"
        # etcd3gw imports requests, which probes the network when imported: only a replica pays it.
        from etcd3gw import exceptions
        from etcd3gw.lease import Lease

        self._unreachable = (exceptions.ConnectionFailedError, exceptions.ConnectionTimeoutError)
        self._slow = exceptions.ConnectionTimeoutError
        self._refused = exceptions.Etcd3Exception
        self._lease_of = Lease
        self._clients = [_client(url, config.etcd_tls) for url in config.etcd]
        self._lease: Any = None
        self._lock = threading.Lock()
        self.valid_until = 0.0

    def place(self, name: str, address: str) -> None:
        self.name, self.address = name, address

    # -- requests, on the first endpoint that answers ------------------------------------------

    def _call(self, request: Any) -> Any:
        last = ""
        slow = 0
        for index, client in enumerate(self._clients):
            try:
                result = request(client)
            except self._unreachable as error:
                last = f"{client.base_url}: {_detail(error)}"
                slow += isinstance(error, self._slow)
                continue
            except self._refused as error:
                raise EtcdError(f"etcd refused the request: {_detail(error)}") from None
            if index:  # this one answers: ask it first from now on
                self._clients.insert(0, self._clients.pop(index))
            return result
        # OpenSSL's reason alone does not say which setting to look at.
        hint = _TLS_HINT if "SSL" in last else ""
        raise EtcdError(f"no etcd endpoint answered (the last: {last}){hint}", timed_out=slow == len(self._clients))

    # -- the lease -------------------------------------------------------------------------------

    def grant(self) -> None:
        """A new lease for this process (after the last one was lost), and the registration under it."""
        sent = time.monotonic()
        lease = self._call(lambda c: c.lease(ttl=self.config.lease_seconds))
        with self._lock:
            self._lease = lease
            self.valid_until = sent + self.config.lease_seconds - LEASE_MARGIN_S
        self._call(lambda c: c.put(self.prefix + "replicas/" + self.name, self.address, lease=lease))

    def renew(self) -> bool:
        """Renew the lease; False when etcd says it is gone (it expired). Raises EtcdError when etcd
        could not be asked."""
        lease = self._lease
        if lease is None:
            return False
        sent = time.monotonic()
        ttl = self._call(lambda c: self._lease_of(lease.id, c).refresh())
        if ttl <= 0:
            return False
        with self._lock:
            self.valid_until = max(self.valid_until, sent + min(ttl, self.config.lease_seconds) - LEASE_MARGIN_S)
        return True

    def lease_valid(self) -> bool:
        return time.monotonic() < self.valid_until

    def revoke(self) -> None:
        """Give the lease back (on a clean stop): the primary key and the registration go at once."""
        lease, self._lease = self._lease, None
        self.valid_until = 0.0
        if lease is not None:
            try:
                self._call(lambda c: self._lease_of(lease.id, c).revoke())
            except EtcdError as error:
                _LOGGER.warning("could not revoke the etcd lease (it expires by itself): %s", error)

    # -- the shard's keys ------------------------------------------------------------------------

    def watch(self, changed: threading.Event) -> KeyWatch:
        """Watch the shard's keys: ``changed`` is set at every change (and when the watch ends)."""
        import requests
        from etcd3gw import exceptions

        request = {"create_request": {"key": _encode(self.prefix), "range_end": _encode(_prefix_end(self.prefix))}}

        def start(client: Etcd3Client) -> Any:
            # etcd3gw has no streaming call: its session is used, and its errors raised as its own.
            try:
                # A watch is quiet while nothing changes: only its connection has a timeout.
                response = client.session.post(
                    client.get_url("/watch"), json=request, stream=True, timeout=(REQUEST_TIMEOUT_S, None)
                )
                response.raise_for_status()
            except requests.Timeout as error:
                raise exceptions.ConnectionTimeoutError(str(error)) from None
            except requests.RequestException as error:
                raise exceptions.ConnectionFailedError(str(error)) from None
            return response

        return KeyWatch(self._call(start), changed)

    def read(self) -> ShardKeys:
        found = self._call(lambda c: c.get_prefix(self.prefix))
        primary: PrimaryRecord | None = None
        epoch = epoch_revision = in_sync_revision = 0
        in_sync: tuple[str, ...] | None = None
        replicas: dict[str, str] = {}
        for value, meta in found:
            key = meta["key"].decode()[len(self.prefix) :]
            text = value.decode()
            if key == "primary":
                record = json.loads(text)
                primary = PrimaryRecord(str(record["name"]), str(record["address"]), int(record["epoch"]))
            elif key == "epoch":
                epoch, epoch_revision = int(text), int(meta["mod_revision"])
            elif key == "in_sync":
                in_sync, in_sync_revision = tuple(json.loads(text)["names"]), int(meta["mod_revision"])
            elif key.startswith("replicas/"):
                replicas[key.removeprefix("replicas/")] = text
        return ShardKeys(primary, epoch, epoch_revision, in_sync, in_sync_revision, replicas)

    def campaign(self, keys: ShardKeys) -> PrimaryRecord | None:
        """Become primary at the next epoch, if ``keys`` are still what etcd holds; the record, or None."""
        lease = self._lease
        if lease is None or not self.lease_valid():
            return None
        record = PrimaryRecord(self.name, self.address, keys.epoch + 1)
        compare = [
            _compare(self.prefix + "primary", "CREATE", create_revision=0),
            _compare(self.prefix + "epoch", "MOD", mod_revision=keys.epoch_revision),
            _compare(self.prefix + "in_sync", "MOD", mod_revision=keys.in_sync_revision),
        ]
        success = [
            _put(self.prefix + "primary", record.value(), lease.id),
            _put(self.prefix + "epoch", str(record.epoch)),
            _put(self.prefix + "in_sync", _in_sync_value(record.epoch, [self.name])),
        ]
        result = self._call(lambda c: c.transaction({"compare": compare, "success": success, "failure": []}))
        return record if result.get("succeeded") else None

    def set_in_sync(self, record: PrimaryRecord, names: list[str]) -> bool:
        """Write the in-sync set, only while ``record`` is still the primary; whether it was written."""
        compare = [_compare(self.prefix + "primary", "VALUE", value=_encode(record.value()))]
        success = [_put(self.prefix + "in_sync", _in_sync_value(record.epoch, names))]
        result = self._call(lambda c: c.transaction({"compare": compare, "success": success, "failure": []}))
        return bool(result.get("succeeded"))

    def resign(self, record: PrimaryRecord) -> None:
        """Delete the primary key if it is still ``record`` (a clean stop: the backups need not wait
        for the lease)."""
        compare = [_compare(self.prefix + "primary", "VALUE", value=_encode(record.value()))]
        success = [{"request_delete_range": {"key": _encode(self.prefix + "primary")}}]
        try:
            self._call(lambda c: c.transaction({"compare": compare, "success": success, "failure": []}))
        except EtcdError as error:
            _LOGGER.warning("could not resign in etcd (the lease runs out instead): %s", error)


def _client(url: str, tls: EtcdTls | None) -> Etcd3Client:
    import etcd3gw
    import requests

    parts = urlsplit(url)
    assert parts.hostname is not None and parts.port is not None  # ReplicationConfig checked it
    session = requests.Session()
    if tls is not None and tls.ca is not None:
        session.verify = str(tls.ca)
        # Else requests' REQUESTS_CA_BUNDLE (set on many hosts) would replace the CA given.
        session.trust_env = False
    if tls is not None and tls.cert is not None and tls.key is not None:
        session.cert = (str(tls.cert), str(tls.key))
    return etcd3gw.client(
        host=parts.hostname, port=parts.port, protocol=parts.scheme, timeout=REQUEST_TIMEOUT_S, session=session
    )


_TLS_HINT = (
    " (with https:// endpoints, replication.etcd_tls.ca must be the CA that signed etcd's certificate, "
    "which must name the endpoint's host; an etcd with --client-cert-auth also needs "
    "replication.etcd_tls.cert and key)"
)


def _detail(error: Exception) -> str:
    """What etcd3gw's error says: it keeps its text in ``detail_text``, not in its arguments."""
    return str(getattr(error, "detail_text", None) or error or type(error).__name__)


def _prefix_end(prefix: str) -> str:
    """The end of the range of keys that start with ``prefix`` (its last character plus one)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def _compare(key: str, target: str, **condition: Any) -> dict[str, Any]:
    return {"key": _encode(key), "result": "EQUAL", "target": target, **condition}


def _put(key: str, value: str, lease: int | None = None) -> dict[str, Any]:
    put: dict[str, Any] = {"key": _encode(key), "value": _encode(value)}
    if lease is not None:
        put["lease"] = lease
    return {"request_put": put}


def _in_sync_value(epoch: int, names: list[str]) -> str:
    return json.dumps({"epoch": epoch, "names": sorted(names)})
