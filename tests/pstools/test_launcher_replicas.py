"""What the local cluster starts for replicated shards: R servers per shard, each told the etcd
and the cluster's job, and each worker given the shard's replica set."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import pytest

from psserver.serve_cli import serve
from pstools import etcd, launcher
from pstools.launcher import ClusterConfig, ClusterError, cluster_job, run_cluster, start_shards
from pstools.server_set import ServerSet

ETCD = "http://127.0.0.1:2379"


class Started:
    """``start_server`` standing in: records what each server would be started with; the n-th
    server started is at port 41000 + n."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(
        self,
        log_dir: Path,
        rule: str,
        lr: float | None,
        rule_opts: Sequence[str],
        extra_args: Sequence[str] = (),
        log_name: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> tuple[object, str]:
        self.calls.append({"args": list(extra_args), "log_name": log_name, "config": config})
        return object(), f"127.0.0.1:{41000 + len(self.calls) - 1}"


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> Iterator[Started]:
    fake = Started()
    monkeypatch.setattr(launcher, "start_server", fake)
    monkeypatch.setattr(launcher, "free_ports", lambda count: [42000 + n for n in range(count)])
    yield fake


def test_each_shard_is_a_replica_set_in_the_clusters_etcd_job(started: Started, tmp_path: Path) -> None:
    checkpoints = {"checkpoints": {"directory": str(tmp_path / "ckpt")}}
    config = ClusterConfig(shards=2, replicas=2, log_dir=tmp_path / "my run", server_config=checkpoints)
    servers = ServerSet()
    addresses = start_shards(config, servers, ETCD)

    # The workers are given each shard's replicas, at the addresses they bound (and advertise).
    assert addresses == ["127.0.0.1:41000|127.0.0.1:41001", "127.0.0.1:41002|127.0.0.1:41003"]
    assert len(servers) == 4
    # A replica that exits is started again where it was (ServerSet, tests/pstools/test_server_set.py).
    assert all(server.relaunch is not None for server in servers.servers)
    options = {opt for param in serve.params for opt in param.opts}
    for number, call in enumerate(started.calls):
        shard, replica = divmod(number, 2)
        args = call["args"]
        # Its own port (pstools.etcd.free_ports: none a port-0 bind is given), where it comes back.
        assert args == ["--port", str(42000 + replica), "--etcd", f"{ETCD}/my-run"] and "--etcd" in options
        assert urlsplit(args[3]).path == "/my-run", "the job travels as the URL's path"
        assert call["config"]["shard"] == {"shard_index": shard, "num_shards": 2}
        assert call["log_name"] == f"server-{shard}-{replica}.log"
        # Two replicas of a shard never share a checkpoint folder.
        assert call["config"]["checkpoints"]["directory"] == str(tmp_path / "ckpt" / f"replica-{replica}")


def test_psserver_serve_takes_the_replicas_flags(tmp_path: Path) -> None:
    # The flags as psserver serve parses them (its own parser, nothing started).
    context = serve.make_context("serve", ["--etcd", f"{ETCD}/{cluster_job(tmp_path / 'run-1')}"])
    assert context.params["etcd"] == (f"{ETCD}/run-1",)
    with pytest.raises(click.UsageError):
        serve.make_context("serve", ["--etcd"])


def test_one_replica_starts_the_lone_servers_of_before(started: Started, tmp_path: Path) -> None:
    config = ClusterConfig(shards=2, log_dir=tmp_path, server_args=("--consistency", "bsp"))
    servers = ServerSet()
    assert start_shards(config, servers, None) == ["127.0.0.1:41000", "127.0.0.1:41001"]
    assert [call["args"] for call in started.calls] == [["--consistency", "bsp"]] * 2
    assert [call["log_name"] for call in started.calls] == ["server-0.log", "server-1.log"]
    # A lone server is not started again: what it held since its checkpoint is gone either way.
    assert [server.relaunch for server in servers.servers] == [None, None]
    assert [call["config"]["shard"]["shard_index"] for call in started.calls] == [0, 1]


@pytest.mark.parametrize(("folder", "job"), [("latest", "latest"), ("a b:c", "a-b-c"), (".x.", "x"), ("--", "hetps")])
def test_the_job_is_the_log_folders_name_in_safe_letters(tmp_path: Path, folder: str, job: str) -> None:
    assert cluster_job(tmp_path / "runs" / folder) == job


def test_without_etcd_replicas_name_its_package_and_a_rerun_starts_afresh(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(etcd.shutil, "which", lambda name: None)
    # A previous run's etcd data: every run elects afresh.
    (tmp_path / "etcd" / "member").mkdir(parents=True)
    with pytest.raises(ClusterError, match=r"--replicas 2 needs etcd: .*apt-get install etcd-server"):
        run_cluster(ClusterConfig(workers=1, slowdowns=(1.0,), replicas=2, log_dir=tmp_path))
    assert not (tmp_path / "server-0-0.log").exists(), "no server was started"
    assert not (tmp_path / "etcd").exists()
