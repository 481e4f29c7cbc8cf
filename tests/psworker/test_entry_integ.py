"""The ``psworker`` command stops on SIGINT even when it was started with SIGINT ignored."""

from __future__ import annotations

import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]


def test_sigint_stops_a_worker_started_with_sigint_ignored() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens here: the worker keeps retrying its Join
    worker = f"{shlex.quote(sys.executable)} -m psworker train --server 127.0.0.1:{port}"
    # What a non-interactive shell does to a command it starts in the background: SIGINT ignored.
    command = ["bash", "-c", f"trap '' INT; exec {worker}"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        # Only once bash has exec'd the worker: a SIGINT before that would stop bash itself.
        cmdline = Path(f"/proc/{process.pid}/cmdline")
        while b"psworker" not in cmdline.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.05)
        # Until the worker has its handler (after imports and a re-exec), a SIGINT is ignored.
        while process.poll() is None and time.monotonic() < deadline:
            process.send_signal(signal.SIGINT)
            time.sleep(0.5)
        assert process.poll() is not None, "the worker ignored SIGINT for 30 s"
        assert process.returncode != 0
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=10)
