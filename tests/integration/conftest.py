"""Real psserver processes on an ephemeral 127.0.0.1 port, always stopped after the test."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from pscli.config_file import merged
from psproto.v1 import ps_pb2_grpc
from pstools.etcd import LocalEtcd
from pstools.launcher import start_server
from pstools.warm_start import Program, stop_process
from tests.integration.replica_sets import ReplicaSet, replica_set

StartServer = Callable[..., str]


@pytest.fixture
def start_psserver(tmp_path: Path) -> Iterator[StartServer]:
    """``start_psserver(rule="asgd", lr=0.1, rule_opts=(), ...)`` returns ``127.0.0.1:PORT``."""
    started = []

    def start(
        rule: str = "asgd",
        lr: float | None = None,
        rule_opts: tuple[str, ...] = (),
        shard_index: int = 0,
        num_shards: int = 1,
        **kwargs: Any,
    ) -> str:
        shard = {"shard": {"shard_index": shard_index, "num_shards": num_shards}}
        config = merged(kwargs.pop("config", None) or {}, shard)
        process, address = start_server(tmp_path, rule, lr, rule_opts, config=config, **kwargs)
        started.append(process)
        return address

    yield start
    codes = [stop_process(process) for process in started]
    assert codes == [0] * len(codes), f"psserver exit codes after SIGTERM: {codes}"


@pytest.fixture
def stub_for() -> Iterator[Callable[[str], ps_pb2_grpc.ParameterServerStub]]:
    channels: list[grpc.Channel] = []

    def make(address: str) -> ps_pb2_grpc.ParameterServerStub:
        channel = grpc.insecure_channel(address)
        channels.append(channel)
        return ps_pb2_grpc.ParameterServerStub(channel)

    yield make
    for channel in channels:
        channel.close()


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[LocalEtcd]:
    """A single-member etcd on free loopback ports (``etcd.url``), stopped after the test; replicated
    shards' tests take it, and are skipped with a message where Debian's etcd is missing (as
    Prometheus's are; `make test` installs both where it can)."""
    if shutil.which("etcd") is None:
        pytest.skip("Debian's etcd is not installed; make test installs it (apt-get install etcd-server)")
    with LocalEtcd(tmp_path / "etcd") as server:
        yield server


@pytest.fixture
def processes() -> Iterator[list[Program]]:
    """Processes a test started (servers, workers); any still running after it is killed."""
    started: list[Program] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture
def replicas(tmp_path: Path, etcd: LocalEtcd) -> Iterator[ReplicaSet]:
    """Three replicas of shard 0 behind their own etcd proxies (``replica_sets``)."""
    yield from replica_set(tmp_path, etcd)
