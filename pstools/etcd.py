"""A local single-member etcd, the coordinator of replicated shards, as a child process.

Replicated shards elect their primary in etcd (``psserver serve --etcd URL``). The local cluster
(``psworker cluster --replicas``) and the tests start one here: Debian's ``etcd`` (package
``etcd-server``) on two free loopback ports (clients and peers), its data in a folder the caller
gives, ready once its ``/health`` says so. There is one member, so there is nothing to replicate
and it is up in about half a second; it is a test and demo coordinator, not a production one.
Given a ``ServerTls`` it serves https:// with that certificate (and with its ``client_ca``, asks
clients for certificates that CA signed), as a production etcd is set up.
"""

from __future__ import annotations

import json
import random
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from psserver.rpc.security import ServerTls

# The Debian package that ships the etcd binary (3.4 in bookworm).
ETCD_PACKAGE = "etcd-server"
ETCD_START_TIMEOUT_S = 20.0
ETCD_STOP_TIMEOUT_S = 10.0
# A port another process took between our probe and etcd's bind: try again on new ones.
_START_ATTEMPTS = 3
# The lowest port ``free_ports`` gives (well above the ports services are known by).
_FIXED_PORTS_FROM = 10000
_POLL_S = 0.05


class EtcdError(RuntimeError):
    """etcd is not installed, or did not start (the message says which and where its log is)."""


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports free on 127.0.0.1 now, for a program that cannot bind port 0 and say
    which it got (etcd), or that must come back at the same port (a restarted replica).

    They are taken below the kernel's ephemeral range, so no socket bound to port 0 meanwhile (a
    metrics server, a client's connection) can be given one of them while its program is down."""
    low = _ephemeral_low()
    found: list[int] = []
    candidates = random.sample(range(_FIXED_PORTS_FROM, low), min(low - _FIXED_PORTS_FROM, 50 * count))
    for port in candidates:
        try:
            with socket.create_server(("127.0.0.1", port)):
                found.append(port)
        except OSError:
            continue
        if len(found) == count:
            return found
    raise EtcdError(f"no {count} free ports on 127.0.0.1 between {_FIXED_PORTS_FROM} and {low}")


def _ephemeral_low() -> int:
    """Where the kernel's ports for port-0 binds begin (Linux; 32768 elsewhere)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _healthy(url: str, context: ssl.SSLContext | None) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1.0, context=context) as reply:
            return bool(json.load(reply).get("health") == "true")
    except (OSError, ValueError):
        return False


def _client_context(tls: ServerTls | None) -> ssl.SSLContext | None:
    """How the health probe reaches an https:// etcd: trusting ``client_ca`` (which signs etcd's
    certificate too, here), presenting etcd's own certificate as a client's."""
    if tls is None:
        return None
    context = ssl.create_default_context(cafile=str(tls.client_ca) if tls.client_ca else None)
    context.load_cert_chain(tls.cert, tls.key)
    return context


class LocalEtcd:
    """A running single-member etcd; ``url`` is its client URL (``http://127.0.0.1:PORT``, or
    ``https://`` with ``tls``).

    A context manager: leaving it stops etcd. The data folder stays, so a test can look at it or
    a restart (``LocalEtcd(data_dir)`` again) finds the same keys."""

    def __init__(
        self,
        data_dir: Path,
        binary: str | None = None,
        timeout_s: float = ETCD_START_TIMEOUT_S,
        tls: ServerTls | None = None,
    ) -> None:
        found = binary or shutil.which("etcd")
        if found is None or shutil.which(found) is None:
            raise EtcdError(
                f"etcd is not installed ({binary or 'no etcd on PATH'}): install Debian's package "
                f"{ETCD_PACKAGE} (apt-get install {ETCD_PACKAGE}) or put etcd on PATH"
            )
        self.data_dir = data_dir
        self.tls = tls
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(_START_ATTEMPTS):
            client, peer = free_ports(2)
            self.url = f"{'https' if tls else 'http'}://127.0.0.1:{client}"
            self.process = self._start(found, client, peer)
            try:
                self._wait_until_healthy(timeout_s)
                return
            except EtcdError:
                self.kill()
                if attempt == _START_ATTEMPTS - 1 or "address already in use" not in self._log_tail():
                    raise

    def _start(self, binary: str, client: int, peer: int) -> subprocess.Popen[bytes]:
        peer_url = f"http://127.0.0.1:{peer}"
        command = [
            binary,
            "--name",
            "hetps",
            "--data-dir",
            str(self.data_dir),
            "--listen-client-urls",
            self.url,
            "--advertise-client-urls",
            self.url,
            "--listen-peer-urls",
            peer_url,
            "--initial-advertise-peer-urls",
            peer_url,
            "--initial-cluster",
            f"hetps={peer_url}",
        ]
        if self.tls is not None:
            command += ["--cert-file", str(self.tls.cert), "--key-file", str(self.tls.key)]
            if self.tls.client_ca is not None:
                command += ["--client-cert-auth", "--trusted-ca-file", str(self.tls.client_ca)]
        with self.log_path.open("ab") as log:
            return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    def _log_tail(self) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-5:])

    def _wait_until_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        context = _client_context(self.tls)
        while not _healthy(self.url, context):
            code = self.process.poll()
            if code is not None:
                raise EtcdError(f"etcd exited with {code} before it answered; see {self.log_path}:\n{self._log_tail()}")
            if time.monotonic() > deadline:
                raise EtcdError(f"etcd did not answer {self.url}/health within {timeout_s:.0f} s; see {self.log_path}")
            time.sleep(_POLL_S)

    def stop(self, timeout_s: float = ETCD_STOP_TIMEOUT_S) -> int:
        """SIGTERM, wait (SIGKILL after ``timeout_s``); returns etcd's exit code."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                return self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        return self.process.wait()

    def kill(self) -> None:
        """SIGKILL, as a crash would: the coordinator gone at once, leases and all."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()

    def __enter__(self) -> LocalEtcd:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
