"""Replicated shards with real processes on 127.0.0.1: one etcd, three replicas of one shard, workers
given the replica set. Primaries killed (SIGKILL), paused (SIGSTOP) past their lease, and cut off from
etcd: nothing acknowledged is lost or applied twice, and a deposed primary acknowledges nothing more."""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
import torch

from pstasks.tasks import load_task
from pstools.etcd import LocalEtcd, free_ports
from pstools.launcher import start_server
from pstools.warm_start import Program
from psworker.client import ClientConfig
from psworker.optim import ParameterServerOptimizer
from psworker.sessions import RetryPolicy
from tests.integration.probes import status, wait_for
from tests.integration.tcp_proxy import TcpProxy
from tests.integration.test_faults_integ import finish
from tests.integration.workers import WarmTrain, train_command

pytestmark = pytest.mark.integration

EXIT_DEPOSED = 75
SYNC_TIMEOUT_S = 60.0


@dataclass
class ReplicaSet:
    """Three replicas of shard 0, each on a fixed port (a restart comes back at the same address),
    each reaching etcd through a proxy of its own (a test may cut one off)."""

    tmp_path: Path
    etcd: LocalEtcd
    job: str
    ports: list[int]
    proxies: list[TcpProxy]
    processes: list[Program | None] = field(default_factory=list)
    starts: int = 0

    @property
    def addresses(self) -> list[str]:
        return [f"127.0.0.1:{port}" for port in self.ports]

    @property
    def servers(self) -> str:
        return "|".join(self.addresses)

    def start(self, index: int) -> None:
        self.starts += 1
        etcd_url = f"http://{self.proxies[index].address}/{self.job}"
        extra = ["--port", str(self.ports[index]), "--etcd", etcd_url]
        process, _ = start_server(
            self.tmp_path, "asgd", 0.05, (), extra_args=extra, log_name=f"r{index}-{self.starts}.log"
        )
        while len(self.processes) <= index:
            self.processes.append(None)
        self.processes[index] = process

    def role(self, index: int) -> str:
        process = self.processes[index]
        if process is None or process.poll() is not None:
            return "gone"
        try:
            return status(self.addresses[index]).replica.role
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
                replica = status(self.addresses[index]).replica
            except grpc.RpcError:
                return []
            return [index] if sum(b.in_sync for b in replica.backups) >= backups else []

        return wait_for(ready, SYNC_TIMEOUT_S, f"{backups} backup(s) in sync")[0]


def start_worker(
    servers: str, name: str, log: Path, until_clock: int, seed: int = 0, step_seconds: float = 0.1
) -> WarmTrain:
    """A digits worker given the replica set, paced (``step_seconds`` a step) so the failovers fall mid-run."""
    settings = {"train": {"step_seconds": step_seconds, "client": {"retry": {"give_up_seconds": 120}}}}
    command = train_command(servers, name, until_clock, seed=seed, log=log, settings=settings)
    return WarmTrain(command, log.with_suffix(".out"))


@pytest.fixture
def replicas(tmp_path: Path, etcd: LocalEtcd) -> Iterator[ReplicaSet]:
    host, port = etcd.url.removeprefix("http://").rsplit(":", 1)
    proxies = [TcpProxy((host, int(port))) for _ in range(3)]
    replica_set = ReplicaSet(tmp_path, etcd, "test", free_ports(3), proxies)
    for index in range(3):
        replica_set.start(index)
    yield replica_set
    for process in replica_set.processes:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
    for proxy in proxies:
        proxy.close()


def test_five_primaries_killed_at_random_lose_and_double_nothing(
    replicas: ReplicaSet, processes: list[Program]
) -> None:
    """kill -9 of the primary five times while three workers train; each time the killed replica is
    started again and caught up before the next kill."""
    replicas.in_sync(2)
    until = 850
    workers = [
        start_worker(replicas.servers, f"w{i}", replicas.tmp_path / f"w{i}.jsonl", until, seed=i) for i in range(3)
    ]
    processes.extend(workers)
    rng = random.Random(5)
    kills = []
    for kill in range(5):
        threshold = 100 + 150 * kill + rng.randrange(50)
        primary = replicas.in_sync(2)
        address, at_least = replicas.addresses[primary], threshold
        wait_for(lambda: status(address).clock >= at_least, 120, f"clock {at_least}")  # noqa: B023
        clock = status(replicas.addresses[primary]).clock
        process = replicas.processes[primary]
        assert process is not None
        process.send_signal(signal.SIGKILL)
        process.wait()
        killed_at = time.monotonic()
        successor = replicas.primary()
        kills.append((clock, time.monotonic() - killed_at))
        assert successor != primary
        replicas.start(primary)
    summaries = [finish(worker, timeout=240) for worker in workers]
    final = status(replicas.addresses[replicas.in_sync(2)])
    acknowledged = sum(int(s["pushes"]) for s in summaries)
    print(f"\nkilled at clocks (and seconds to a new primary): {kills}; {acknowledged} pushes acknowledged")
    assert all(clock < until - 50 for clock, _ in kills), "a kill came after the training"
    assert final.replica.epoch >= 6  # five failovers after the first election
    assert final.applied_pushes == acknowledged == final.clock
    for summary in summaries:
        assert summary["test_accuracy"] >= 0.90, summary
    # Each backup holds the primary's version once it is idle.
    versions = {status(address).replica.version for address in replicas.addresses}
    assert len(versions) == 1, versions


@dataclass
class Prober:
    """Pushes without pause to one replica only, without retries, noting when each was acknowledged."""

    address: str
    name: str
    acked: list[float] = field(default_factory=list)
    refused: list[float] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        task = load_task("digits")
        model = task.build_model()
        config = ClientConfig(retry=RetryPolicy(give_up_seconds=0.0))
        optimizer = ParameterServerOptimizer.configured(model, self.address, self.name, config)
        try:
            while not self.stop.is_set():
                for parameter in model.parameters():
                    parameter.grad = torch.zeros_like(parameter)
                try:
                    optimizer.step()
                except grpc.RpcError:
                    self.refused.append(time.monotonic())
                    time.sleep(0.05)
                else:
                    self.acked.append(time.monotonic())
        finally:
            optimizer.close()


def _probe(address: str, name: str) -> tuple[Prober, threading.Thread]:
    prober = Prober(address, name)
    thread = threading.Thread(target=prober.run, daemon=True)
    thread.start()
    wait_for(lambda: len(prober.acked) >= 3, 60, "the prober's first pushes")
    return prober, thread


def test_a_paused_and_a_cut_off_primary_acknowledge_nothing_after_their_lease(
    replicas: ReplicaSet, processes: list[Program]
) -> None:
    """SIGSTOP of the primary past its lease, then SIGCONT: a backup took over, the paused one
    acknowledges nothing after it resumes and exits 75. Then the new primary's link to etcd is cut:
    it acknowledges nothing once its lease may have run out, another takes over, it exits 75. A
    worker trains through both; every push it was acknowledged is applied once."""
    replicas.in_sync(2)
    worker = start_worker(replicas.servers, "w0", replicas.tmp_path / "w0.jsonl", 400, step_seconds=0.05)
    processes.append(worker)

    paused = replicas.in_sync(2)
    prober, thread = _probe(replicas.addresses[paused], "paused-prober")
    probers = [prober]
    process = replicas.processes[paused]
    assert process is not None
    process.send_signal(signal.SIGSTOP)
    successor = replicas.primary()
    assert successor != paused
    time.sleep(0.5)
    resumed_at = time.monotonic()
    process.send_signal(signal.SIGCONT)
    assert process.wait(timeout=30) == EXIT_DEPOSED
    prober.stop.set()
    thread.join(timeout=30)
    late = [at for at in prober.acked if at > resumed_at]
    assert not late, f"{len(late)} push(es) acknowledged by the deposed primary after it resumed"
    replicas.start(paused)

    cut = replicas.in_sync(2)
    prober, thread = _probe(replicas.addresses[cut], "cut-prober")
    probers.append(prober)
    cut_at = replicas.proxies[cut].cut()
    process = replicas.processes[cut]
    assert process is not None
    assert process.wait(timeout=30) == EXIT_DEPOSED
    prober.stop.set()
    thread.join(timeout=30)
    lease = 2.0
    late = [at - cut_at for at in prober.acked if at > cut_at + lease]
    assert not late, f"pushes acknowledged {late} s after the primary was cut off from etcd"
    replicas.proxies[cut].restore()
    replicas.start(cut)

    summary = finish(worker, timeout=240)
    final = status(replicas.addresses[replicas.in_sync(2)])
    acknowledged = int(summary["pushes"]) + sum(len(p.acked) for p in probers)
    # A probe push refused for the lease may have been applied (it reached the backups first); none
    # is sent twice, and the worker's retries keep their push ids.
    unanswered = sum(len(p.refused) for p in probers)
    print(f"\n{acknowledged} pushes acknowledged, {unanswered} refused; applied {final.applied_pushes}")
    assert final.applied_pushes == final.clock
    assert acknowledged <= final.applied_pushes <= acknowledged + unanswered
