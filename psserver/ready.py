"""The ready file: how a process that started ``psserver serve`` learns it is serving, and where.

``psserver serve --ready-file PATH`` writes one JSON object to PATH once the server accepts
RPCs (written to a temporary name and renamed, so a reader never sees half of it), and removes
it when it starts draining. Launchers, tests and benchmarks wait for that file instead of
reading the server's stdout; ``psserver.app.ServerApp`` writes it.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Protocol

READY_FORMAT = 1


@dataclass(frozen=True)
class ReadyInfo:
    """What a serving shard tells whoever started it."""

    host: str
    port: int
    pid: int
    shard_index: int
    num_shards: int
    rule: str
    clock: int
    # None when the server serves no Prometheus metrics (--metrics-port off).
    metrics_port: int | None
    format: int = READY_FORMAT

    @property
    def address(self) -> str:
        """HOST:PORT to dial; a server bound to every interface is dialled on loopback."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "[::]": "::1"}.get(self.host, self.host)
        return f"[{host}]:{self.port}" if ":" in host and not host.startswith("[") else f"{host}:{self.port}"


class ReadyFileError(RuntimeError):
    """The server did not become ready: it exited, or the wait ran out."""


def write_ready_file(path: Path, info: ReadyInfo) -> None:
    """Write ``info`` to ``path`` at once: readers see no file or all of it."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(asdict(info)) + "\n")
    os.replace(partial, path)


def read_ready_file(path: Path) -> ReadyInfo:
    data = json.loads(path.read_text())
    if data.get("format") != READY_FORMAT:
        raise ReadyFileError(f"{path}: ready file format {data.get('format')!r}; expected {READY_FORMAT}")
    return ReadyInfo(**data)


class _Started(Protocol):
    """The process that will write the file (a :class:`subprocess.Popen` or the like)."""

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...


def wait_for_ready_file(path: Path, process: _Started | None = None, timeout_s: float = 60.0) -> ReadyInfo:
    """Wait until ``path`` exists and return what it says; fails early when ``process`` exits.

    A server that crashed leaves its file behind: remove ``path`` before starting the process."""
    deadline = time.monotonic() + timeout_s
    while True:
        if path.exists():
            return read_ready_file(path)
        if process is not None and process.poll() is not None:
            raise ReadyFileError(f"the server exited with code {process.returncode} before it was ready")
        if time.monotonic() > deadline:
            raise ReadyFileError(f"the server wrote no ready file ({path}) within {timeout_s:g} s")
        time.sleep(0.02)
