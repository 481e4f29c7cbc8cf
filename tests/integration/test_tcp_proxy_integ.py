"""The test proxy's cut: every open connection reset, new ones refused or held silent until
restored, then connections carry bytes again."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from tests.integration.tcp_proxy import TcpProxy


@contextlib.contextmanager
def echo_server() -> Iterator[tuple[str, int]]:
    """A loopback server that sends back what it reads, on every connection."""
    listener = socket.create_server(("127.0.0.1", 0))

    def echo(conn: socket.socket) -> None:
        with conn:
            while data := _recv(conn):
                conn.sendall(data)

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=echo, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield listener.getsockname()
    finally:
        listener.close()


def _recv(conn: socket.socket) -> bytes:
    """What came next: empty at the end of the stream or at a reset."""
    try:
        return conn.recv(1024)
    except ConnectionResetError:
        return b""


def dial(proxy: TcpProxy) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proxy.port), timeout=2.0)


def echoes(conn: socket.socket) -> bool:
    conn.sendall(b"ping")
    return _recv(conn) == b"ping"


def test_cut_resets_open_connections_refuses_new_ones_and_restore_heals() -> None:
    with echo_server() as upstream, TcpProxy(upstream) as proxy:
        before = dial(proxy)
        assert echoes(before)
        proxy.cut()
        # The open connection is gone at once: a reset, not a silence nor a clean end.
        with pytest.raises(ConnectionResetError):
            before.recv(1024)
        # A new one is met with a reset (while connecting or at its first read), never an echo.
        with pytest.raises((ConnectionResetError, BrokenPipeError)), dial(proxy) as refused:
            refused.sendall(b"ping")
            refused.recv(1024)
        assert proxy.refused == 1
        proxy.restore()
        with dial(proxy) as after:
            assert echoes(after)
        assert proxy.drops == 1 and proxy.connections == 2
        before.close()


def test_cut_with_black_hole_holds_new_connections_silent_until_restored() -> None:
    with echo_server() as upstream, TcpProxy(upstream) as proxy:
        proxy.cut(new="black_hole")
        held = dial(proxy)
        held.settimeout(0.5)
        held.sendall(b"ping")
        with pytest.raises(TimeoutError):
            held.recv(1024)
        assert proxy.connections == 0, "a held connection never reached the upstream"
        proxy.restore()
        # The held one is reset (its dialler reconnects); new ones carry bytes.
        held.settimeout(2.0)
        with pytest.raises(ConnectionResetError):
            held.recv(1024)
        with dial(proxy) as after:
            assert echoes(after)
        held.close()
