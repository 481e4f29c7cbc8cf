"""SIGTERM drains: a push already streaming finishes, new RPCs are refused, exit code 0."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch

from psproto import codec
from psproto.layout import Layout
from psproto.v1 import ps_pb2, ps_pb2_grpc
from psworker.launcher import start_server, stop_process

pytestmark = pytest.mark.integration
LAYOUT = Layout.from_named_shapes([("w", (64,))])


def test_sigterm_finishes_the_push_in_flight_then_exits_zero(tmp_path: Path) -> None:
    process, address = start_server(tmp_path, "asgd", 1.0, ())
    try:
        with grpc.insecure_channel(address) as channel:
            stub = ps_pb2_grpc.ParameterServerStub(channel)
            joined = stub.Join(ps_pb2.JoinRequest(worker_name="w", layout=LAYOUT.to_proto(), layout_hash=LAYOUT.hash))
            stub.Init(
                iter(
                    [
                        ps_pb2.InitRequest(
                            header=ps_pb2.InitHeader(worker_id=joined.worker_id, layout_hash=LAYOUT.hash)
                        ),
                        *(ps_pb2.InitRequest(chunk=c) for c in codec.encode(torch.zeros(64))),
                    ]
                )
            )
            header_sent = threading.Event()
            release = threading.Event()

            def slow_push() -> Iterator[ps_pb2.PushRequest]:
                yield ps_pb2.PushRequest(
                    header=ps_pb2.PushHeader(
                        worker_id=joined.worker_id,
                        push_id=1,
                        base_clock=0,
                        kind=ps_pb2.PAYLOAD_KIND_GRADIENT,
                        layout_hash=LAYOUT.hash,
                    )
                )
                header_sent.set()
                release.wait(10)
                for chunk in codec.encode(torch.ones(64)):
                    yield ps_pb2.PushRequest(chunk=chunk)

            future = stub.Push.future(slow_push(), timeout=30)
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
