"""What the local cluster starts for replicated shards: R servers per shard, each told the etcd,
the cluster's job and the address it advertises, and each worker given the shard's replica set."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from itertools import count
from pathlib import Path
from typing import Any

import pytest

from pstools import launcher
from pstools.launcher import ClusterConfig, cluster_job, start_shards

ETCD = "http://127.0.0.1:2379"


class Started:
    """``start_server`` standing in: records what each server would be started with."""

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
        args = list(extra_args)
        port = args[args.index("--port") + 1] if "--port" in args else str(60000 + len(self.calls))
        self.calls.append({"args": args, "log_name": log_name, "config": config})
        return object(), f"127.0.0.1:{port}"


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> Iterator[Started]:
    fake = Started()
    ports = count(41000)
    monkeypatch.setattr(launcher, "start_server", fake)
    monkeypatch.setattr(launcher, "free_ports", lambda n: [next(ports) for _ in range(n)])
    yield fake


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_each_shard_is_a_replica_set_in_the_clusters_etcd_job(started: Started, tmp_path: Path) -> None:
    checkpoints = {"checkpoints": {"directory": str(tmp_path / "ckpt")}}
    config = ClusterConfig(shards=2, replicas=2, log_dir=tmp_path / "my run", server_config=checkpoints)
    servers: list[Any] = []
    addresses = start_shards(config, servers, ETCD)

    assert addresses == ["127.0.0.1:41000|127.0.0.1:41001", "127.0.0.1:41002|127.0.0.1:41003"]
    assert len(servers) == 4
    for number, call in enumerate(started.calls):
        shard, replica = divmod(number, 2)
        args = call["args"]
        assert _flag(args, "--etcd") == ETCD
        assert _flag(args, "--job") == "my-run"
        # It binds the port it advertises, and that is the address the workers are given.
        assert _flag(args, "--advertise") == f"127.0.0.1:{_flag(args, '--port')}"
        assert _flag(args, "--advertise") == addresses[shard].split("|")[replica]
        assert call["config"]["shard"] == {"shard_index": shard, "num_shards": 2}
        assert call["log_name"] == f"server-{shard}-{replica}.log"
        # Two replicas of a shard never share a checkpoint folder.
        assert call["config"]["checkpoints"]["directory"] == str(tmp_path / "ckpt" / f"replica-{replica}")


def test_one_replica_starts_the_lone_servers_of_before(started: Started, tmp_path: Path) -> None:
    config = ClusterConfig(shards=2, log_dir=tmp_path, server_args=("--consistency", "bsp"))
    assert start_shards(config, [], None) == ["127.0.0.1:60000", "127.0.0.1:60001"]
    assert [call["args"] for call in started.calls] == [["--consistency", "bsp"]] * 2
    assert [call["log_name"] for call in started.calls] == [None, None]


@pytest.mark.parametrize(("folder", "job"), [("latest", "latest"), ("a b:c", "a-b-c"), (".x.", "x"), ("--", "hetps")])
def test_the_job_is_the_log_folders_name_in_safe_letters(tmp_path: Path, folder: str, job: str) -> None:
    assert cluster_job(tmp_path / "runs" / folder) == job
