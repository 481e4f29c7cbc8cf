"""A call waiting in a real psserver whose client gave up ends there and stops keeping its worker
alive (psserver.core.waiting).

SSP with bound 0: a pull of the worker that is ahead waits for the one behind. Its client's
deadline passes; the server must then end the wait (counted ABANDONED) and the abandoned worker,
silent from then on, is evicted after its lease while the other keeps heartbeating.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc
import pytest
import torch

from psproto import codec
from psproto.errors import Reason
from psproto.v1 import ps_pb2, ps_pb2_grpc
from tests.integration.conftest import StartServer
from tests.integration.test_protocol_integ import LAYOUT, _init, _join, _push

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

Stub = ps_pb2_grpc.ParameterServerStub
LEASE_S = 1.5
TIMEOUT_S = 5.0


def _wait_for(condition: Callable[[], bool], seconds: float, what: str) -> float:
    """Poll ``condition`` (bounded); how long it took."""
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        if condition():
            return time.monotonic() - began
        time.sleep(0.05)
    raise AssertionError(f"{what} did not happen within {seconds} s")


def test_a_pull_whose_client_gave_up_ends_is_counted_and_its_worker_is_evicted(
    start_psserver: StartServer, stub_for: Callable[[str], Stub]
) -> None:
    address = start_psserver(
        "asgd",
        lr=0.1,
        extra_args=("--consistency", "ssp", "--ssp-bound", "0"),
        config={"shard": {"lease_seconds": LEASE_S}},
    )
    stub = stub_for(address)
    ahead, behind = _join(stub, "ahead").worker_id, _join(stub, "behind").worker_id
    assert _init(stub, ahead, torch.zeros(LAYOUT.total_length)).applied
    for worker_id in (ahead, behind):
        list(stub.Pull(ps_pb2.PullRequest(worker_id=worker_id), timeout=TIMEOUT_S))
    _push(stub, list(codec.encode(torch.ones(LAYOUT.total_length))), worker_id=ahead)

    # One push ahead under bound 0: this pull waits for "behind", past its client's deadline.
    with pytest.raises(grpc.RpcError) as gave_up:
        list(stub.Pull(ps_pb2.PullRequest(worker_id=ahead), timeout=0.5))
    assert gave_up.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED

    # The other worker's call is served, well within its deadline.
    began = time.monotonic()
    stub.Heartbeat(ps_pb2.HeartbeatRequest(worker_id=behind), timeout=TIMEOUT_S)
    served_after = time.monotonic() - began
    print(f"\nanother worker's call served {served_after:.2f} s after the abandoned pull's deadline")
    assert served_after < 2.0

    def abandoned_counted() -> bool:
        rejected = stub.Status(ps_pb2.StatusRequest(), timeout=TIMEOUT_S).rejected
        return rejected[Reason.ABANDONED.label] == 1

    _wait_for(abandoned_counted, 3.0, "the abandoned wait counted in Status")

    # "ahead" is silent from now on; "behind" keeps heartbeating. Only "ahead" is evicted.
    def only_behind_left() -> bool:
        stub.Heartbeat(ps_pb2.HeartbeatRequest(worker_id=behind), timeout=TIMEOUT_S)
        workers = stub.Status(ps_pb2.StatusRequest(), timeout=TIMEOUT_S).workers
        return [w.worker_id for w in workers] == [behind]

    evicted_after = _wait_for(only_behind_left, LEASE_S + 4.0, "the abandoned worker's eviction")
    print(f"abandoned worker evicted {evicted_after:.2f} s later (lease {LEASE_S} s)")
    # The other worker goes on: its push is applied and its pull is not held back by the gone worker.
    _push(stub, list(codec.encode(torch.ones(LAYOUT.total_length))), worker_id=behind)
    replies = list(stub.Pull(ps_pb2.PullRequest(worker_id=behind), timeout=TIMEOUT_S))
    assert replies and replies[0].clock == 2
