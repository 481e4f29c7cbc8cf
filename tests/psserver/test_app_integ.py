"""ServerApp in-process: built on port 0, spoken to with real gRPC on 127.0.0.1, drained, stopped;
what cannot be built or started is a typed error."""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from psproto import codec
from psproto.layout import Layout
from psproto.v1 import ps_pb2, ps_pb2_grpc
from psserver.app import (
    BindError,
    CheckpointConfig,
    CheckpointRestoreError,
    MetricsBindError,
    MetricsConfig,
    SecurityConfig,
    SecurityFilesError,
    ServerApp,
    ServerAppError,
    ServerConfig,
    ServerConfigError,
)
from psserver.core.checkpoint import list_checkpoints, write_checkpoint
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psserver.ready import read_ready_file
from psserver.rpc.security import ServerTls
from psserver.rpc.server import ServerLimits

LAYOUT = Layout.from_named_shapes([("w", (64,))])
ASGD = RuleSpec.parse("asgd", {"lr": "1.0"})


def _config(**changes: object) -> ServerConfig:
    base = ServerConfig(
        ShardConfig(ASGD), host="127.0.0.1", port=0, torch_threads=None, drain_seconds=5.0, metrics=None
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def _join_and_init(stub: ps_pb2_grpc.ParameterServerStub) -> int:
    joined = stub.Join(
        ps_pb2.JoinRequest(worker_name="w", layout=LAYOUT.to_proto(), layout_hash=LAYOUT.hash), timeout=10
    )
    header = ps_pb2.InitHeader(worker_id=joined.worker_id, layout_hash=LAYOUT.hash)
    stub.Init(
        iter(
            [ps_pb2.InitRequest(header=header), *(ps_pb2.InitRequest(chunk=c) for c in codec.encode(torch.zeros(64)))]
        ),
        timeout=10,
    )
    return int(joined.worker_id)


def _push(worker_id: int, push_id: int, release: threading.Event | None = None) -> Iterator[ps_pb2.PushRequest]:
    """One gradient push; with ``release`` the chunks wait for it after the header is sent."""
    header = ps_pb2.PushHeader(
        worker_id=worker_id, push_id=push_id, base_clock=0, kind=ps_pb2.PAYLOAD_KIND_GRADIENT, layout_hash=LAYOUT.hash
    )
    yield ps_pb2.PushRequest(header=header)
    if release is not None:
        release.wait(10)
    yield from (ps_pb2.PushRequest(chunk=c) for c in codec.encode(torch.ones(64)))


def _first_refusal(stub: ps_pb2_grpc.ParameterServerStub, timeout_s: float = 5.0) -> grpc.RpcError:
    """Call Status until the server refuses it (a drain has begun); the refusal."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            stub.Status(ps_pb2.StatusRequest(), timeout=2)
        except grpc.RpcError as error:
            return error
        time.sleep(0.02)
    raise AssertionError("the server never refused Status")


def test_a_server_on_port_0_serves_then_stops_with_a_final_checkpoint(tmp_path: Path) -> None:
    ready_file = tmp_path / "ready.json"
    config = _config(
        metrics=MetricsConfig(port=0, process_metrics=False),
        checkpoints=CheckpointConfig(tmp_path / "ckpt", every_updates=1000),
        ready_file=ready_file,
    )
    with ServerApp.build(config) as app:
        assert app.port > 0 and app.address == f"127.0.0.1:{app.port}"
        assert read_ready_file(ready_file) == app.ready_info
        assert app.ready_info.metrics_port == app.metrics_port
        with grpc.insecure_channel(app.address) as channel:
            stub = ps_pb2_grpc.ParameterServerStub(channel)
            worker_id = _join_and_init(stub)
            assert stub.Push(_push(worker_id, 1), timeout=10).clock == 1
            status = stub.Status(ps_pb2.StatusRequest(), timeout=10)
            assert (status.clock, [w.worker_name for w in status.workers]) == (1, ["w"])
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
        with urllib.request.urlopen(f"http://127.0.0.1:{app.metrics_port}/metrics", timeout=10) as reply:
            assert b"hetps_clock" in reply.read()
    assert not ready_file.exists(), "a stopped server still says it is ready"
    assert app.final_checkpoint is not None and app.final_checkpoint.clock == 1
    assert [clock for _, clock, _ in list_checkpoints(tmp_path / "ckpt")] == [1]
    # The next server built from the same config starts where this one stopped.
    assert ServerApp.build(config).shard.clock == 1


def test_drain_finishes_the_push_in_flight_and_refuses_new_rpcs() -> None:
    app = ServerApp.build(_config()).start()
    try:
        with grpc.insecure_channel(app.address) as channel:
            stub = ps_pb2_grpc.ParameterServerStub(channel)
            worker_id = _join_and_init(stub)
            release = threading.Event()
            in_flight = stub.Push.future(_push(worker_id, 1, release), timeout=20)
            time.sleep(0.3)  # the header reached the server: the push is in progress
            draining = threading.Thread(target=app.drain, args=(10.0,))
            draining.start()
            try:
                refused = _first_refusal(stub)
                assert refused.code() == grpc.StatusCode.UNAVAILABLE
                assert "draining" in (refused.details() or "")
                assert draining.is_alive()  # held open by the push in progress
            finally:
                release.set()
            assert in_flight.result(timeout=10).clock == 1
            draining.join(10)
            assert not draining.is_alive()
    finally:
        app.stop()
    assert app.shard.clock == 1


def test_every_failure_to_build_or_start_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"shard_index 2 must be 0\.\.1"):
        ShardConfig(ASGD, shard_index=2, num_shards=2)
    with pytest.raises(ServerConfigError, match="keep at least 1"):
        CheckpointConfig(tmp_path, keep=0)
    with pytest.raises(ValueError, match="receive_buffers must be >= 1, not 0"):
        ShardConfig(ASGD, receive_buffers=0)
    with pytest.raises(ValueError, match="pull_versions must be >= 1, not 0"):
        ShardConfig(ASGD, pull_versions=0)
    with pytest.raises(ValueError, match="max_receiving_pushes must be >= 0"):
        ShardConfig(ASGD, max_receiving_pushes=-1)
    with pytest.raises(ServerConfigError, match=r"shard.chunk_bytes: .*above half the largest message"):
        _config(transport=ServerLimits(max_message_bytes=1024**2))
    with pytest.raises(ServerConfigError, match="log_level must be one of DEBUG, INFO, WARNING, ERROR, not 'LOUD'"):
        _config(log_level="LOUD")
    with pytest.raises(ServerConfigError, match=r"--ready-file .*: its folder .* does not exist or is not writable"):
        ServerApp.build(_config(ready_file=tmp_path / "missing" / "ready.json"))
    with pytest.raises(SecurityFilesError, match="--auth-token-file"):
        ServerApp.build(_config(security=SecurityConfig(auth_token_file=tmp_path / "missing")))
    missing = tmp_path / "missing.pem"
    with pytest.raises(SecurityFilesError, match="--tls-cert"):
        ServerApp.build(_config(security=SecurityConfig(tls=ServerTls(missing, missing))))

    other = Shard(ShardConfig(RuleSpec.parse("momentum", {})))
    other.join("a", "cpu", False, LAYOUT, LAYOUT.hash)
    write_checkpoint(tmp_path / "other", other.state_dict(), keep=1)
    with pytest.raises(CheckpointRestoreError, match="rule momentum"):
        ServerApp.build(_config(checkpoints=CheckpointConfig(tmp_path / "other")))

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(BindError, match=f"cannot listen on 127.0.0.1:{port}"):
            ServerApp.build(_config(port=port)).start()
        metrics_taken = ServerApp.build(_config(metrics=MetricsConfig(port=port, process_metrics=False)))
        with pytest.raises(MetricsBindError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            metrics_taken.start()
    for error in (ServerConfigError, SecurityFilesError, CheckpointRestoreError, BindError, MetricsBindError):
        assert issubclass(error, ServerAppError)


def test_a_server_without_metrics_reports_none() -> None:
    with ServerApp.build(_config()) as app:
        assert app.metrics is None and app.metrics_port is None and app.ready_info.metrics_port is None
        with grpc.insecure_channel(app.address) as channel:
            assert ps_pb2_grpc.ParameterServerStub(channel).Status(ps_pb2.StatusRequest(), timeout=10).clock == 0
