"""SIGTERM drains: a push already streaming finishes, health turns NOT_SERVING, new RPCs are
refused with UNAVAILABLE, exit code 0."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from psproto import codec
from psproto.layout import Layout
from psproto.v1 import ps_pb2, ps_pb2_grpc
from pstools.launcher import start_server
from pstools.warm_start import stop_process

pytestmark = pytest.mark.integration
LAYOUT = Layout.from_named_shapes([("w", (64,))])


def _join_and_init(stub: ps_pb2_grpc.ParameterServerStub) -> int:
    joined = stub.Join(
        ps_pb2.JoinRequest(worker_name="w", layout=LAYOUT.to_proto(), layout_hash=LAYOUT.hash), timeout=10
    )
    stub.Init(
        iter(
            [
                ps_pb2.InitRequest(header=ps_pb2.InitHeader(worker_id=joined.worker_id, layout_hash=LAYOUT.hash)),
                *(ps_pb2.InitRequest(chunk=c) for c in codec.encode(torch.zeros(64))),
            ]
        ),
        timeout=10,
    )
    return int(joined.worker_id)


def _push_messages(worker_id: int, push_id: int) -> list[ps_pb2.PushRequest]:
    header = ps_pb2.PushHeader(
        worker_id=worker_id, push_id=push_id, base_clock=0, kind=ps_pb2.PAYLOAD_KIND_GRADIENT, layout_hash=LAYOUT.hash
    )
    return [ps_pb2.PushRequest(header=header), *(ps_pb2.PushRequest(chunk=c) for c in codec.encode(torch.ones(64)))]


def _slow_push(worker_id: int, header_sent: threading.Event, release: threading.Event) -> Iterator[ps_pb2.PushRequest]:
    """A push that sends its header, then holds its chunks back until ``release``."""
    header, *chunks = _push_messages(worker_id, 1)
    yield header
    header_sent.set()
    release.wait(10)
    yield from chunks


def test_sigterm_finishes_the_push_in_flight_then_exits_zero(tmp_path: Path) -> None:
    process, address = start_server(tmp_path, "asgd", 1.0, ())
    try:
        with grpc.insecure_channel(address) as channel:
            stub = ps_pb2_grpc.ParameterServerStub(channel)
            worker_id = _join_and_init(stub)
            header_sent = threading.Event()
            release = threading.Event()
            future = stub.Push.future(_slow_push(worker_id, header_sent, release), timeout=30)
            assert header_sent.wait(10)
            time.sleep(0.3)
            process.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            release.set()
            reply = future.result()
            assert reply.clock == 1
        assert process.wait(30) == 0
    finally:
        stop_process(process)


def test_while_draining_health_is_not_serving_and_new_rpcs_are_unavailable(tmp_path: Path) -> None:
    process, address = start_server(tmp_path, "asgd", 1.0, (), config={"drain_seconds": 8.0})
    try:
        with grpc.insecure_channel(address) as channel:
            stub = ps_pb2_grpc.ParameterServerStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            request = health_pb2.HealthCheckRequest(service="psproto.v1.ParameterServer")
            assert health.Check(request, timeout=5).status == health_pb2.HealthCheckResponse.SERVING
            worker_id = _join_and_init(stub)
            # A push in progress keeps the server draining (up to --drain-seconds) while we look.
            header_sent, release = threading.Event(), threading.Event()
            in_flight = stub.Push.future(_slow_push(worker_id, header_sent, release), timeout=20)
            try:
                assert header_sent.wait(5)
                time.sleep(0.2)  # the header reached the server: the push is in progress
                process.send_signal(signal.SIGTERM)
                deadline = time.monotonic() + 5
                status = health_pb2.HealthCheckResponse.SERVING
                while status == health_pb2.HealthCheckResponse.SERVING and time.monotonic() < deadline:
                    time.sleep(0.05)
                    status = health.Check(request, timeout=2).status
                assert status == health_pb2.HealthCheckResponse.NOT_SERVING
                overall = health.Check(health_pb2.HealthCheckRequest(), timeout=2)
                assert overall.status == health_pb2.HealthCheckResponse.NOT_SERVING
                with pytest.raises(grpc.RpcError) as join_refused:
                    stub.Join(
                        ps_pb2.JoinRequest(worker_name="late", layout=LAYOUT.to_proto(), layout_hash=LAYOUT.hash),
                        timeout=2,
                    )
                assert join_refused.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "draining" in (join_refused.value.details() or "")
                with pytest.raises(grpc.RpcError) as push_refused:
                    stub.Push(iter(_push_messages(worker_id, 2)), timeout=2)
                assert push_refused.value.code() == grpc.StatusCode.UNAVAILABLE
                assert process.poll() is None  # still draining: the first push has not finished
            finally:
                release.set()
            assert in_flight.result(timeout=10).clock == 1  # only the push already in progress landed
        assert process.wait(10) == 0
    finally:
        stop_process(process)


def test_a_worker_stopped_with_sigterm_leaves_the_shard_and_exits_143(tmp_path: Path) -> None:
    process, address = start_server(tmp_path, "asgd", 0.05, (), config={"shard": {"lease_seconds": 600.0}})
    channel = grpc.insecure_channel(address)
    stub = ps_pb2_grpc.ParameterServerStub(channel)

    def joined() -> list[str]:
        return [w.worker_name for w in stub.Status(ps_pb2.StatusRequest(), timeout=10).workers]

    worker = subprocess.Popen(
        [sys.executable, "-m", "psworker", "train", "--server", address, "--name", "pod-0", "--until-clock", "9999999"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and stub.Status(ps_pb2.StatusRequest(), timeout=10).applied_pushes < 5:
            time.sleep(0.2)
        assert joined() == ["pod-0"]
        worker.send_signal(signal.SIGTERM)
        _, stderr = worker.communicate(timeout=30)
        assert worker.returncode == 128 + signal.SIGTERM, stderr
        # Gone at once, not after the 600 s lease: its replacement may join under the same name.
        assert joined() == []
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        channel.close()
        assert stop_process(process) == 0
