"""The ``[replication]`` table of a server's configuration (``psserver serve --etcd URL``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from psproto.security import read_pem

# etcd's shortest lease with its default timing (heartbeat 100 ms, election 1 s) is 2 s: a
# shorter one is raised to it by etcd itself.
DEFAULT_LEASE_SECONDS = 2
DEFAULT_JOB = "hetps"


@dataclass(frozen=True)
class EtcdTls:
    """How a replica reaches an etcd that serves https:// (etcd's ``--cert-file``), and one that asks
    for client certificates (``--client-cert-auth``)."""

    # PEM CA that signed etcd's certificate; None: the CA bundle of Python's requests (certifi, or
    # $REQUESTS_CA_BUNDLE).
    ca: Path | None = None
    # PEM certificate this replica presents to etcd, for --client-cert-auth (with key).
    cert: Path | None = None
    # PEM private key of that certificate.
    key: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ValueError("replication.etcd_tls: cert and key go together; give both, or neither")

    def check_files(self) -> None:
        """Read every file now, so a bad one fails the start naming its key
        (``psproto.security.SecurityConfigError``) rather than every request to etcd."""
        for path, key, marker in ((self.ca, "ca", "CERTIFICATE"), (self.cert, "cert", "CERTIFICATE")):
            if path is not None:
                read_pem(path, f"replication.etcd_tls.{key}", marker)
        if self.key is not None:
            read_pem(self.key, "replication.etcd_tls.key", "PRIVATE KEY")


@dataclass(frozen=True)
class ReplicationConfig:
    """A shard served by a replica set: every process with the same ``job`` and shard index is one
    of its replicas; etcd elects the primary."""

    # etcd endpoints (http://HOST:PORT or https://HOST:PORT, its v3 JSON gateway); the first that
    # answers is used.
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
    # How often a replica reads the shard's keys (the primary's liveness, the replicas) besides
    # each change etcd's watch tells of: how long a watch that broke silently goes unnoticed.
    poll_seconds: float = 1.0
    # TLS to etcd, for https:// endpoints; None: etcd's own certificate checked against the CA
    # bundle of Python's requests, and no client certificate.
    etcd_tls: EtcdTls | None = None

    def __post_init__(self) -> None:
        if not self.etcd:
            raise ValueError("replication.etcd: give at least one etcd endpoint (http://HOST:PORT)")
        for url in self.etcd:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None:
                raise ValueError(f"replication.etcd: {url!r} is not http://HOST:PORT or https://HOST:PORT")
            if self.etcd_tls is not None and parts.scheme != "https":
                raise ValueError(f"replication.etcd_tls is for https:// endpoints; {url!r} is plain http")
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
