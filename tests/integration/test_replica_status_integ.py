"""A replica set as an operator watches it: two real replicas of one shard and one etcd, seen through
``psserver status``, ``psserver top`` and each replica's metrics, before and after a failover."""

from __future__ import annotations

import signal
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from psproto.v1 import ps_pb2, ps_pb2_grpc
from psserver.cli import main
from psserver.ready import read_ready_file
from pstools.etcd import LocalEtcd
from pstools.launcher import WarmProcess, start_server
from pstools.warm_start import stop_process
from tests.integration.probes import status, wait_for
from tests.integration.test_checkpoint_integ import _join_and_init, _push

pytestmark = pytest.mark.integration


class Replica:
    def __init__(self, process: WarmProcess, address: str, metrics_port: int) -> None:
        self.process, self.address, self.metrics_port = process, address, metrics_port

    def standing(self) -> ps_pb2.ReplicaStatus:
        return status(self.address).replica

    def metric(self, name: str, **labels: str) -> float:
        """The value of the one sample ``name`` whose labels include ``labels`` (shard 0's), in a scrape."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        wanted = {"shard": "0", **labels}
        (value,) = [
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == name and wanted.items() <= sample.labels.items()
        ]
        return float(value)


@pytest.fixture
def replicas(tmp_path: Path, etcd: LocalEtcd) -> Iterator[list[Replica]]:
    """Two replicas of shard 0, started at once; stopped after the test (SIGTERM: exit 0)."""

    def start(name: str) -> Replica:
        process, address = start_server(
            tmp_path, "asgd", 0.5, (), extra_args=("--etcd", f"{etcd.url}/observe"), log_name=f"{name}.log"
        )
        ready = read_ready_file(tmp_path / f"{name}.ready.json")
        assert ready.metrics_port is not None
        return Replica(process, address, ready.metrics_port)

    with ThreadPoolExecutor(2) as pool:
        started = list(pool.map(start, ("replica-a", "replica-b")))
    try:
        yield started
    finally:
        codes = [stop_process(replica.process) for replica in started if replica.process.poll() is None]
        assert codes == [0] * len(codes), f"replica exit codes after SIGTERM: {codes}"


def _cli(*args: str) -> str:
    result = CliRunner(env={"COLUMNS": "160"}).invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def _in_sync_pair(replicas: list[Replica]) -> Callable[[], tuple[Replica, Replica] | None]:
    """(primary, backup) once one is primary and names the other in sync in its Status."""

    def pair() -> tuple[Replica, Replica] | None:
        for primary, backup in (replicas, replicas[::-1]):
            standing = primary.standing()
            if standing.role == "primary" and any(b.in_sync and b.address == backup.address for b in standing.backups):
                return primary, backup
        return None

    return pair


def test_status_top_and_metrics_show_each_replicas_standing_before_and_after_a_failover(
    replicas: list[Replica],
) -> None:
    primary, backup = wait_for(_in_sync_pair(replicas), 20, "a primary with its backup in sync")
    with grpc.insecure_channel(primary.address) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        worker = _join_and_init(stub)
        for push_id in range(1, 4):
            _push(stub, worker, push_id, push_id - 1)
    version = primary.standing().version
    assert version >= 5  # a join, an init, three pushes: each acknowledged once the backup held it
    assert backup.standing().version == version

    # psserver status: the replica's standing and, on the primary, its backups with their lag.
    before = _cli("status", "--server", primary.address)
    name = primary.standing().name
    standing = f"primary  epoch 1  primary {primary.address}  in sync yes  version {version}  holds clock 3"
    assert f"replica {name}  {standing}" in before
    (row,) = [line.split() for line in before.splitlines() if backup.address in line.split()[1:2]]
    assert row == ["0", backup.address, primary.address, "yes", "0", "0", "B", "0.0", "ms"]
    # A backup's shard stays empty until promoted; the state it holds is at the primary's clock.
    of_backup = _cli("status", "--server", backup.address)
    assert "shard 0/1  clock 0" in of_backup
    assert f"backup  epoch 1  primary {primary.address}  in sync yes  version {version}  holds clock 3" in of_backup

    # psserver top: both replicas in one view.
    top = _cli("top", "--once", "--server", primary.address, "--server", backup.address)
    rows = [line.split() for line in top.splitlines()]
    standings = {row[1]: row[2:8] for row in rows if row[:1] == ["0"] and row[2] in ("primary", "backup")}
    assert standings[primary.address] == ["primary", "1", primary.address, "yes", str(version), "3"]
    assert standings[backup.address] == ["backup", "1", primary.address, "yes", str(version), "3"]

    # The metrics: each replica's role, epoch and version; the backup's lag on the primary.
    backup_name = backup.standing().name
    assert primary.metric("hetps_replica_role", replica=name, role="primary") == 1
    assert primary.metric("hetps_replica_role", replica=name, role="backup") == 0
    assert backup.metric("hetps_replica_role", replica=backup_name, role="backup") == 1
    assert backup.metric("hetps_replica_version", replica=backup_name) == version
    assert primary.metric("hetps_backup_in_sync", backup=backup_name) == 1
    assert primary.metric("hetps_backup_lag_versions", backup=backup_name) == 0
    assert backup.metric("hetps_replica_failovers_total", replica=backup_name) == 0

    # kill -9 of the primary: the backup takes over at the next epoch and counts a failover.
    primary.process.send_signal(signal.SIGKILL)
    primary.process.wait()
    wait_for(lambda: backup.standing().role == "primary", 15, "the backup to take over")
    after = _cli("status", "--server", backup.address)
    assert f"replica {backup_name}  primary  epoch 2  primary {backup.address}  in sync yes" in after
    assert "failovers 1  digest mismatches 0" in after
    assert backup.metric("hetps_replica_role", replica=backup_name, role="primary") == 1
    assert backup.metric("hetps_replica_epoch", replica=backup_name) == 2
    assert backup.metric("hetps_replica_failovers_total", replica=backup_name) == 1
