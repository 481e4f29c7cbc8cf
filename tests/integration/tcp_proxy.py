"""A TCP proxy for tests that can go silent (it stops forwarding without closing either side), cut
a process off (it drops every connection and takes no new one) or be flaky (it drops connections
and delays data at random).

``black_hole()`` makes every connection, old and new, a link that delivers nothing: both
sockets stay open, nothing is read from either (so nothing is acknowledged beyond the kernel's
buffers), no FIN or RST is sent, as when a host died or the network partitioned. New
connections are still accepted (the kernel completes TCP handshakes on a listening socket) but
carry nothing. ``restore()`` lets every connection carry bytes again, those held back included,
in order, so a connection an endpoint still trusts resumes where it stopped.

``cut()`` drops every open connection (both sides reset, as a failed link or a firewall does)
and, until ``restore()``, refuses new ones (accepted and reset at once: the dialler gets a reset,
not a connection) or, with ``new="black_hole"``, holds them open carrying nothing, so the dialler
waits on its own timeout. A replica behind it is cut off from etcd: its lease keep-alives fail
while etcd and everyone else carry on.

With a ``seed`` the proxy is flaky: each connection is dropped (both sides closed) after a random
life of 0.3 to 2.5 s, and about one forwarded read in twenty is delayed by up to 50 ms.
"""

from __future__ import annotations

import contextlib
import random
import socket
import struct
import threading
import time
from types import TracebackType
from typing import Literal

# How often a blocked pump looks whether the proxy was closed.
_POLL_S = 0.1


class _Link:
    """One proxied connection: its two sockets, and when a flaky proxy drops it."""

    def __init__(self, sockets: tuple[socket.socket, socket.socket], dies_at: float, rng: random.Random | None):
        self.sockets = sockets
        self.dies_at = dies_at
        self.rng = rng
        self.dropped = threading.Event()


class TcpProxy:
    """Forward ``127.0.0.1:port`` to ``upstream``; silent when told, flaky with a ``seed``."""

    def __init__(self, upstream: tuple[str, int], seed: int | None = None) -> None:
        self.upstream = upstream
        self._random = random.Random(seed) if seed is not None else None
        self.drops = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self.listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.connections = 0
        self.silenced_at: float | None = None
        # How new connections are met while cut (None: not cut), and how many were.
        self._cut: Literal["refuse", "black_hole"] | None = None
        self.refused = 0
        self._forwarding = threading.Event()
        self._forwarding.set()
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._links: list[_Link] = []
        # Connections accepted while cut with new="black_hole": held open, carrying nothing.
        self._held: list[socket.socket] = []
        self._threads: list[threading.Thread] = []
        self._start(self._accept)

    def black_hole(self) -> float:
        """Stop forwarding on every connection, keeping them all open; returns when (monotonic)."""
        self._forwarding.clear()
        self.silenced_at = time.monotonic()
        return self.silenced_at

    def cut(self, new: Literal["refuse", "black_hole"] = "refuse") -> float:
        """Reset every open connection and meet new ones with ``new`` until :meth:`restore`;
        returns when (monotonic)."""
        with self._lock:
            self._cut = new
            links = [link for link in self._links if not link.dropped.is_set()]
        for link in links:
            self._drop(link)
        self.silenced_at = time.monotonic()
        return self.silenced_at

    def restore(self) -> None:
        """Forward again, old connections and new ones alike; after a cut, take new connections
        again (those held open while cut are reset: their dialler reconnects)."""
        with self._lock:
            self._cut = None
            held, self._held = self._held, []
        for sock in held:
            _reset(sock)
        self._forwarding.set()

    def close(self) -> None:
        """Close the listener and every connection; the pump threads end within a poll."""
        self._closed.set()
        self._forwarding.set()
        with contextlib.suppress(OSError):
            self.listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets + self._held, []
            threads = list(self._threads)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in threads:
            thread.join(timeout=2.0)

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # -- threads ------------------------------------------------------------------------

    def _start(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _wait_forwarding(self, link: _Link) -> bool:
        """Block while black-holed; False once the proxy is closed or the link dropped."""
        while not self._forwarding.wait(_POLL_S):
            if link.dropped.is_set():
                return False
        return not self._closed.is_set() and not link.dropped.is_set()

    def _accept(self) -> None:
        self.listener.settimeout(_POLL_S)
        while not self._closed.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                cut = self._cut
                if cut is not None:
                    self.refused += 1
                if cut == "black_hole":
                    self._held.append(client)
            if cut == "refuse":
                _reset(client)
            if cut is not None:
                continue
            try:
                server = socket.create_connection(self.upstream, timeout=5.0)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._closed.is_set():
                    client.close()
                    server.close()
                    return
                self.connections += 1
                self._sockets += [client, server]
                flaky = self._random
                life = flaky.uniform(0.3, 2.5) if flaky else float("inf")
                link = _Link(
                    (client, server), time.monotonic() + life, random.Random(flaky.random()) if flaky else None
                )
                self._links.append(link)
            self._start(self._pump, client, server, link)
            self._start(self._pump, server, client, link)

    def _drop(self, link: _Link) -> None:
        """Reset both sides of a connection (a flaky proxy's at the end of its life, or every one
        at a cut; counted once)."""
        with self._lock:
            if link.dropped.is_set():
                return
            link.dropped.set()
            self.drops += 1
        for sock in link.sockets:
            _reset(sock)

    def _pump(self, source: socket.socket, sink: socket.socket, link: _Link) -> None:
        source.settimeout(_POLL_S)
        while not self._closed.is_set() and not link.dropped.is_set():
            if link.rng is not None and time.monotonic() > link.dies_at:
                self._drop(link)
                return
            # Black-holed: read nothing, so the sender's bytes pile up unacknowledged by the peer.
            if not self._wait_forwarding(link):
                return
            data = _receive(source)
            if data is None:
                continue
            # Whatever came in just before the black hole (bytes or an end of stream) waits for it to lift.
            if not self._wait_forwarding(link):
                return
            if not data or not _forward(sink, data, link):
                break
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _reset(sock: socket.socket) -> None:
    """Close ``sock`` with a reset (linger 0), waking a thread blocked reading it."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RD)
    sock.close()


def _receive(source: socket.socket) -> bytes | None:
    """The next bytes from ``source``: None if none came within its timeout, empty at its end."""
    try:
        return source.recv(65536)
    except TimeoutError:
        return None
    except OSError:
        return b""


def _forward(sink: socket.socket, data: bytes, link: _Link) -> bool:
    """Send ``data`` on (a flaky link sometimes late first); False once ``sink`` is gone."""
    if link.rng is not None and link.rng.random() < 0.05:
        time.sleep(link.rng.uniform(0.0, 0.05))
    try:
        sink.sendall(data)
    except OSError:
        return False
    return True


# The silent-link tests' name for it.
BlackHoleProxy = TcpProxy
