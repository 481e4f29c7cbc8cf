"""A client that trickles its pushes cannot starve the others, over real gRPC on 127.0.0.1.

A real ``psserver serve`` with two receive buffers; honest ``PSClient`` workers push as fast as
they can, alone and then while two clients trickle pushes one element at a time, each chunk
just inside ``--receive-idle-seconds``, and send a new push whenever one is ended. The honest
workers keep at least half their rate; every trickling push is ended with CANCELLED and
PUSH_STALLED (naming the limit), counted in Status, and never applied.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from benchmarks.slow_senders import GRACE_S, IDLE_S, SERVER_ARGS, HonestWorkers, Trickler
from psproto.v1 import ps_pb2, ps_pb2_grpc
from tests.integration.conftest import StartServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

StubFor = Callable[[str], ps_pb2_grpc.ParameterServerStub]
ALONE_S = 2.0
WITH_S = 4.0
INTERVAL_S = 0.8 * IDLE_S


def test_two_trickling_clients_leave_honest_workers_at_least_half_their_push_rate(
    start_psserver: StartServer, stub_for: StubFor
) -> None:
    address = start_psserver("asgd", lr=0.01, extra_args=list(SERVER_ARGS))
    stub = stub_for(address)
    honest = HonestWorkers(address, count=2)
    tricklers = [Trickler(address, f"trickler-{i}", INTERVAL_S, retry=True) for i in range(2)]
    try:
        honest.rate(0.5)  # warm-up
        alone = honest.rate(ALONE_S)
        for trickler in tricklers:
            trickler.start()
        with_tricklers = honest.rate(WITH_S)
    finally:
        for trickler in tricklers:
            trickler.finish(INTERVAL_S + 5.0)
        honest.close()
    assert not honest.errors, honest.errors
    assert alone > 20, alone
    assert with_tricklers >= 0.5 * alone, (with_tricklers, alone)

    ends = [end for trickler in tricklers for end in trickler.ends]
    for trickler in tricklers:
        first = trickler.ends[0]
        # Ended for its pace soon after the grace; it learns so at its next chunk.
        assert (first["code"], first["reason"], first["limit"]) == ("CANCELLED", "PUSH_STALLED", "min_push_rate")
        assert first["seconds"] < GRACE_S + 2 * INTERVAL_S + 1.0, first
    # Every later push was ended for its pace too, or refused while its worker sat out.
    assert all((e["code"], e["reason"]) == ("CANCELLED", "PUSH_STALLED") for e in ends), ends
    assert {e["limit"] for e in ends} <= {"min_push_rate", "sit_out"}
    status = stub.Status(ps_pb2.StatusRequest(), timeout=10)
    assert status.rejected["push_stalled"] == len(ends)
    # Nothing a trickler sent was applied: every applied push is an honest one.
    assert status.applied_pushes == honest.pushes
