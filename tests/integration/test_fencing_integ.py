"""Fencing with real processes on 127.0.0.1: a primary paused (SIGSTOP) past its lease and one cut off
from etcd by a proxy acknowledge nothing once their lease may have run out, step down (exit 75),
and no acknowledged push is lost or applied twice."""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import dataclass, field

import grpc
import pytest
import torch

from pstasks.tasks import load_task
from psworker.client import ClientConfig
from psworker.optim import ParameterServerOptimizer
from psworker.sessions import RetryPolicy
from tests.integration.probes import status, wait_for
from tests.integration.replica_sets import EXIT_DEPOSED, ReplicaSet

pytestmark = pytest.mark.integration


@dataclass
class Prober:
    """Pushes without pause to one replica only, without retries, noting when each was acknowledged."""

    address: str
    name: str
    # Without retries (a lone replica's address): every failure is seen. With them (the whole set):
    # a worker that follows the primary through the failovers.
    retries: bool = False
    acked: list[float] = field(default_factory=list)
    refused: list[float] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        task = load_task("digits")
        model = task.build_model()
        config = ClientConfig(retry=RetryPolicy(give_up_seconds=120.0 if self.retries else 0.0))
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


def _probe(address: str, name: str, retries: bool = False) -> tuple[Prober, threading.Thread]:
    prober = Prober(address, name, retries)
    thread = threading.Thread(target=prober.run, daemon=True)
    thread.start()
    wait_for(lambda: len(prober.acked) >= 3, 60, "the prober's first pushes")
    return prober, thread


def test_a_paused_and_a_cut_off_primary_acknowledge_nothing_after_their_lease(replicas: ReplicaSet) -> None:
    """SIGSTOP of the primary past its lease, then SIGCONT: a backup took over, the paused one
    acknowledges nothing after it resumes and exits 75. Then the new primary's link to etcd is cut:
    it acknowledges nothing once its lease may have run out, another takes over, it exits 75. A
    worker given the replica set pushes through both; every push acknowledged is applied once."""
    replicas.in_sync(2)
    worker, worker_thread = _probe(replicas.servers, "worker", retries=True)

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

    # The worker got through both failovers: pushes acknowledged by the primary after each.
    wait_for(lambda: [at for at in worker.acked if at > cut_at + lease], 60, "the worker past the second failover")
    assert any(resumed_at < at < cut_at for at in worker.acked)
    worker.stop.set()
    worker_thread.join(timeout=60)
    final = status(replicas.addresses[replicas.in_sync(2)])
    acknowledged = sum(len(p.acked) for p in [worker, *probers])
    # A probe push refused for the lease may have been applied (it reached the backups first); none
    # is sent twice, and the worker's retries keep their push ids.
    unanswered = sum(len(p.refused) for p in probers)
    print(f"\n{acknowledged} pushes acknowledged, {unanswered} refused; applied {final.applied_pushes}")
    assert final.applied_pushes == final.clock
    assert acknowledged <= final.applied_pushes <= acknowledged + unanswered
