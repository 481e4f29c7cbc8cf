"""Fixed ports for programs that cannot bind port 0 or must come back at their port: free now, and
outside the range the kernel hands to port-0 binds (so nothing else is given one meanwhile)."""

from __future__ import annotations

import socket

from pstools.etcd import _ephemeral_low, free_ports


def test_fixed_ports_are_free_distinct_and_below_the_ephemeral_range() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5
    assert all(10000 <= port < _ephemeral_low() for port in ports), ports
    for port in ports:
        with socket.create_server(("127.0.0.1", port)):
            pass
    # A port-0 bind never lands below the range.
    with socket.create_server(("127.0.0.1", 0)) as any_port:
        assert any_port.getsockname()[1] >= _ephemeral_low()
