"""A replica that cannot reach etcd when it starts says so and exits 1, serving nothing."""

from __future__ import annotations

import socket
import subprocess
import sys


def test_serve_exits_1_naming_etcd_when_no_endpoint_answers() -> None:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        closed = probe.getsockname()[1]  # free once closed: nothing listens there
    command = [sys.executable, "-m", "psserver", "serve", "--host", "127.0.0.1", "--port", "0"]
    command += ["--metrics-port", "off", "--etcd", f"http://127.0.0.1:{closed}/job"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1, result.stderr
    assert f"cannot reach etcd at http://127.0.0.1:{closed}" in result.stderr
    assert "Connection refused" in result.stderr, "what the endpoint answered is in the message"
