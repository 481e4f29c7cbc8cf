"""The ``[replication]`` table of a server's configuration (``psserver serve --etcd URL``)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

# etcd's shortest lease with its default timing (heartbeat 100 ms, election 1 s) is 2 s: a
# shorter one is raised to it by etcd itself.
DEFAULT_LEASE_SECONDS = 2
DEFAULT_JOB = "hetps"


@dataclass(frozen=True)
class ReplicationConfig:
    """A shard served by a replica set: every process with the same ``job`` and shard index is one
    of its replicas; etcd elects the primary."""

    # etcd endpoints (http://HOST:PORT, its v3 JSON gateway); the first that answers is used.
    etcd: tuple[str, ...]
    # The key prefix in etcd: /hetps/<job>/shard/<index>/.
    job: str = DEFAULT_JOB
    # HOST:PORT that workers and the other replicas dial to reach this one; None: the bound
    # address (loopback when it binds every interface).
    advertise: str | None = None
    # The primary's lease in etcd, whole seconds (etcd's own minimum is 2). A primary that could
    # not renew it for this long acknowledges nothing more; a backup takes over once it expired.
    lease_seconds: int = DEFAULT_LEASE_SECONDS
    # A backup that has not acknowledged a state within this long leaves the in-sync set.
    ack_timeout_seconds: float = 2.0
    # Every this many state versions, the state sent carries a digest the backup checks.
    digest_every: int = 100
    # How often a replica reads the shard's keys (the primary's liveness, the replicas).
    poll_seconds: float = 0.1

    def __post_init__(self) -> None:
        if not self.etcd:
            raise ValueError("replication.etcd: give at least one etcd endpoint (http://HOST:PORT)")
        for url in self.etcd:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
                raise ValueError(f"replication.etcd: {url!r} is not http://HOST:PORT")
        if not self.job or "/" in self.job:
            raise ValueError(f"replication.job: {self.job!r} must be a non-empty name without '/'")
        if self.advertise is not None:
            host, _, port = self.advertise.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"replication.advertise: {self.advertise!r} is not HOST:PORT")
        if self.lease_seconds < 2:
            raise ValueError(f"replication.lease_seconds: {self.lease_seconds} is below etcd's minimum lease of 2 s")
        if not self.ack_timeout_seconds > 0 or not self.poll_seconds > 0 or self.digest_every < 1:
            raise ValueError(
                "replication.ack_timeout_seconds and poll_seconds must be > 0 and digest_every >= 1: "
                f"{self.ack_timeout_seconds}, {self.poll_seconds}, {self.digest_every}"
            )
