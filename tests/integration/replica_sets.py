"""A shard's replica set of real processes for the integration tests: three ``psserver serve --etcd``
replicas of shard 0 on fixed ports (a restart comes back at the same address), each reaching etcd
through a proxy of its own, and what a test asks of them (the primary, backups in sync)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import grpc

from psproto.v1 import ps_pb2
from pstools.etcd import LocalEtcd, free_ports
from pstools.launcher import start_server
from pstools.warm_start import Program
from tests.integration.probes import status, wait_for
from tests.integration.tcp_proxy import TcpProxy

# A primary that stepped down exits with EX_TEMPFAIL (psserver.serve_cli.EXIT_DEPOSED).
EXIT_DEPOSED = 75
SYNC_TIMEOUT_S = 60.0


@dataclass
class ReplicaSet:
    """Replicas of shard 0, each on a fixed port (a restart comes back at the same address), each
    reaching etcd through a proxy of its own (a test may cut one off); ``server_args`` are given to
    every replica, and ``probe`` reads a replica's Status (with the credentials those ask for)."""

    tmp_path: Path
    etcd: LocalEtcd
    job: str
    ports: list[int]
    proxies: list[TcpProxy]
    processes: list[Program | None] = field(default_factory=list)
    starts: int = 0
    server_args: Sequence[str] = ()
    probe: Callable[[str], ps_pb2.StatusResponse] = status
    # Each replica's log, of its latest start.
    logs: dict[int, Path] = field(default_factory=dict)
    # Every replica's ``--config`` table (e.g. ``replication.etcd_tls`` for an https:// etcd).
    server_table: Mapping[str, Any] = field(default_factory=dict)

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{port}" for port in self.ports]

    @property
    def servers(self) -> str:
        return "|".join(self.addresses)

    def start(self, index: int) -> None:
        self.starts += 1
        etcd_url = f"{urlsplit(self.etcd.url).scheme}://{self.proxies[index].address}/{self.job}"
        extra = ["--port", str(self.ports[index]), "--etcd", etcd_url, *self.server_args]
        self.logs[index] = self.tmp_path / f"r{index}-{self.starts}.log"
        log_name = self.logs[index].name
        process, _ = start_server(
            self.tmp_path, "asgd", 0.05, (), extra_args=extra, log_name=log_name, config=self.server_table
        )
        while len(self.processes) <= index:
            self.processes.append(None)
        self.processes[index] = process

    def role(self, index: int) -> str:
        process = self.processes[index]
        if process is None or process.poll() is not None:
            return "gone"
        try:
            return self.probe(self.addresses[index]).replica.role
        except grpc.RpcError:
            return "gone"

    def primary(self, timeout_s: float = SYNC_TIMEOUT_S) -> int:
        # A list, so that replica 0 counts as found.
        found = wait_for(
            lambda: [i for i in range(len(self.ports)) if self.role(i) == "primary"], timeout_s, "a primary"
        )
        return found[0]

    def in_sync(self, backups: int) -> int:
        """Wait until the primary has ``backups`` backups in sync; its index."""

        def ready() -> list[int]:
            index = self.primary()
            try:
                replica = self.probe(self.addresses[index]).replica
            except grpc.RpcError:
                return []
            return [index] if sum(b.in_sync for b in replica.backups) >= backups else []

        return wait_for(ready, SYNC_TIMEOUT_S, f"{backups} backup(s) in sync")[0]


def replica_set(
    tmp_path: Path,
    etcd: LocalEtcd,
    count: int = 3,
    server_args: Sequence[str] = (),
    probe: Callable[[str], ps_pb2.StatusResponse] = status,
    server_table: Mapping[str, Any] | None = None,
) -> Iterator[ReplicaSet]:
    """``count`` replicas started; every process and proxy stopped after the test."""
    endpoint = urlsplit(etcd.url)
    assert endpoint.hostname is not None and endpoint.port is not None
    proxies = [TcpProxy((endpoint.hostname, endpoint.port)) for _ in range(count)]
    replicas = ReplicaSet(
        tmp_path,
        etcd,
        "test",
        free_ports(count),
        proxies,
        server_args=server_args,
        probe=probe,
        server_table=server_table or {},
    )
    for index in range(count):
        replicas.start(index)
    yield replicas
    for process in replicas.processes:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
    for proxy in proxies:
        proxy.close()
