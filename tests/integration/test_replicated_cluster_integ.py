"""``psworker cluster --replicas 2``: the launcher's own etcd, two servers per shard, workers given
each shard's replica set; they train through the primaries while every backup stays in sync, and
a primary killed mid-run is started again where it was and comes back as a backup."""

from __future__ import annotations

import shutil
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest
import tomllib

from psproto.v1 import ps_pb2, ps_pb2_grpc
from pstools import launcher
from pstools.launcher import ClusterConfig, run_cluster
from pstools.server_set import ServerSet
from psworker.task import Task

pytestmark = pytest.mark.skipif(
    shutil.which("etcd") is None,
    reason="Debian's etcd is not installed; make test installs it (apt-get install etcd-server)",
)


def _status(address: str) -> ps_pb2.StatusResponse:
    with grpc.insecure_channel(address) as channel:
        reply: ps_pb2.StatusResponse = ps_pb2_grpc.ParameterServerStub(channel).Status(
            ps_pb2.StatusRequest(), timeout=10
        )
        return reply


def _settled(replicas: Sequence[str]) -> list[ps_pb2.StatusResponse]:
    """Every replica's Status once they hold one version and every backup is in sync: the workers'
    last changes (their Leave is not waited for) may still be on their way to the backup, and a
    replica started again late in the run may still be catching up."""
    deadline = time.monotonic() + 30
    while True:
        found = [_status(replica) for replica in replicas]
        one_version = len({status.replica.version for status in found}) == 1
        if (one_version and all(s.replica.in_sync for s in found)) or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def _kill_the_primary(servers: ServerSet, at_clock: int, killed: list[str]) -> None:
    """Once shard 0's primary passed ``at_clock``: SIGKILL it, as an operator's kill -9."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for server in servers.servers[:2]:
            status = _status(server.address)
            if status.replica.role == "primary" and status.clock >= at_clock:
                server.process.send_signal(signal.SIGKILL)
                killed.append(server.address)
                return
        time.sleep(0.1)


def test_replicated_shards_train_through_their_primaries_and_a_killed_one_comes_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    standing: dict[str, list[ps_pb2.StatusResponse]] = {}
    evaluate, start_shards = launcher.evaluate_servers, launcher.start_shards
    killed: list[str] = []

    def look_then_evaluate(task: Task, addresses: Sequence[str]) -> launcher.Evaluation:
        # Once the workers are done, before the servers stop: every replica's own view of itself.
        for shard in addresses:
            standing[shard] = _settled(shard.split("|"))
        return evaluate(task, addresses)

    def start_then_kill(config: ClusterConfig, servers: ServerSet, etcd_url: str | None) -> list[str]:
        addresses = start_shards(config, servers, etcd_url)
        threading.Thread(target=_kill_the_primary, args=(servers, 100, killed), daemon=True).start()
        return addresses

    monkeypatch.setattr(launcher, "evaluate_servers", look_then_evaluate)
    monkeypatch.setattr(launcher, "start_shards", start_then_kill)
    log_dir = tmp_path / "replicated"
    report = run_cluster(
        ClusterConfig(workers=2, slowdowns=(1.0, 2.0), shards=2, replicas=2, until_clock=400, log_dir=log_dir)
    )
    assert report.clock >= 400 and report.test_accuracy >= 0.8, report
    assert len(killed) == 1 and report.shard_restarts == 1, (killed, report.shard_restarts)
    assert len(list(log_dir.glob("server-0-?.restart-1.log"))) == 1

    # Each worker was given every shard's two replicas, as the servers advertise themselves; the
    # killed one came back at its address, so the sets the workers hold stay true.
    assert tomllib.loads((log_dir / "worker-0.toml").read_text())["train"]["servers"] == list(standing)
    assert killed[0] in next(iter(standing)).split("|")
    for shard, (first, second) in enumerate(standing.values()):
        replicas = {status.replica.role: status for status in (first, second)}
        assert set(replicas) == {"primary", "backup"}, [s.replica for s in (first, second)]
        primary, backup = replicas["primary"], replicas["backup"]
        assert primary.replica.address in {first.replica.address, second.replica.address}
        assert backup.replica.primary == primary.replica.address
        assert primary.replica.epoch == backup.replica.epoch >= (2 if shard == 0 else 1)
        # acks=all: the backup holds every change the primary acknowledged.
        assert backup.replica.in_sync and [b.in_sync for b in primary.replica.backups] == [True]
        assert backup.replica.version == primary.replica.version >= 400
        assert primary.replica.digest_mismatches == backup.replica.digest_mismatches == 0, shard
    # Shard 0's killed primary is its backup now: the other replica took over.
    assert {s.replica.role: s.replica.address for s in next(iter(standing.values()))}["backup"] == killed[0]
    assert (log_dir / "etcd").is_dir(), "the cluster's etcd keeps its data in the cluster's folder"
