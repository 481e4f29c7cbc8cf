"""The local cluster's servers: each started process, and for a replica how to start it again.

A replica of a replicated shard that exits while the cluster runs (killed, crashed, or a deposed
primary, which exits 75) is started again at the address it had, as a StatefulSet or systemd
would: it registers in etcd under a new name, catches up from the primary as a backup and
re-enters the in-sync set, so the workers' replica sets stay true. A lone server is not
restarted: without replicas what it held since its last checkpoint is gone, and its workers'
errors say so.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pstools.warm_start import WarmProcess, stop_process

_LOGGER = logging.getLogger(__name__)

# Restarts of one replica in a run, as Ray's default max_shard_restarts: one that keeps failing
# (a port another program took, a broken disk) is left down and the set serves on without it.
MAX_RESTARTS = 3
# How often exits are looked for; a replica is down for about this long plus its start.
POLL_S = 0.5

# Starts a replica again: (arguments added to its first start's, its log's name) -> the process,
# or None when it did not start (its log says why).
Relaunch = Callable[[Sequence[str], str], WarmProcess | None]


@dataclass
class Server:
    """One server of the cluster: its process now, where it serves, and (replicas only) how to
    start it again."""

    process: WarmProcess
    address: str
    log_name: str
    relaunch: Relaunch | None = None
    restarts: int = 0


class ServerSet:
    """The cluster's servers; ``watch`` starts again every replica that exits, until ``stop``."""

    def __init__(self) -> None:
        self.servers: list[Server] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, server: Server) -> None:
        self.servers.append(server)

    def __len__(self) -> int:
        return len(self.servers)

    @property
    def restarts(self) -> int:
        return sum(server.restarts for server in self.servers)

    def watch(self) -> None:
        if any(server.relaunch is not None for server in self.servers):
            self._thread = threading.Thread(target=self._run, name="replica-watch", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self.restart_exited()

    def restart_exited(self) -> None:
        """Start again each replica whose process has exited (at most ``MAX_RESTARTS`` times each)."""
        for server in self.servers:
            code = server.process.poll()
            if code is None or server.relaunch is None or server.restarts >= MAX_RESTARTS:
                continue
            server.restarts += 1
            port = server.address.rpartition(":")[2]
            log_name = f"{Path(server.log_name).stem}.restart-{server.restarts}.log"
            _LOGGER.warning(
                "replica %s (%s) exited with %d; starting it again there (restart %d of at most %d; log %s)",
                server.address,
                server.log_name,
                code,
                server.restarts,
                MAX_RESTARTS,
                log_name,
            )
            process = server.relaunch(["--port", port], log_name)
            if process is None:
                _LOGGER.error("replica %s did not start again; see %s", server.address, log_name)
            else:
                server.process = process

    def stop(self) -> list[int]:
        """Stop watching, then every server (SIGTERM, then SIGKILL); their exit codes."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return [stop_process(server.process) for server in self.servers]
