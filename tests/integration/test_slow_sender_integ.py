"""A client that trickles its pushes cannot starve the others, over real gRPC on 127.0.0.1;
nor can one that trickles its Init or stops reading its pull.

A real ``psserver serve`` with two receive buffers; honest ``PSClient`` workers push as fast as
they can, alone and then while two clients trickle pushes one element at a time, each chunk
just inside ``shard.receive_idle_seconds``, and send a new push whenever one is ended. The honest
workers keep at least half their rate; every trickling push is ended with CANCELLED and
PUSH_STALLED (naming the limit), counted in Status, and never applied.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import grpc
import pytest
import torch

from benchmarks.slow_senders import GRACE_S, IDLE_S, SERVER_CONFIG, HonestWorkers, Trickler
from psproto import codec
from psproto.layout import Layout
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
    address = start_psserver("asgd", lr=0.01, config=SERVER_CONFIG)
    stub = stub_for(address)
    honest = HonestWorkers(address, count=2)
    tricklers = [Trickler(address, f"trickler-{i}", INTERVAL_S, retry=True) for i in range(2)]
    try:
        honest.rate(0.5)  # warm-up
        before = honest.rate(ALONE_S)
        for trickler in tricklers:
            trickler.start()
        with_tricklers = honest.rate(WITH_S)
        for trickler in tricklers:
            trickler.finish(GRACE_S + 2 * INTERVAL_S + 5.0)
        after = honest.rate(ALONE_S)
    finally:
        for trickler in tricklers:
            if trickler.is_alive():
                trickler.finish(GRACE_S + 2 * INTERVAL_S + 5.0)
        honest.close()
    assert not honest.errors, honest.errors
    # Alone before and after: on a shared host the load around the test may change between the
    # windows, and the lower of the two is the rate the tricklers' window could expect.
    alone = min(before, after)
    assert alone > 20, (before, after)
    assert with_tricklers >= 0.5 * alone, (with_tricklers, before, after)

    ends = [end for trickler in tricklers for end in trickler.ends]
    for trickler in tricklers:
        first = trickler.ends[0]
        # Ended for its pace soon after the grace; it learns so at its next chunk.
        assert (first["code"], first["reason"], first["limit"]) == ("CANCELLED", "PUSH_STALLED", "min_transfer_rate")
        assert first["seconds"] < GRACE_S + 2 * INTERVAL_S + 1.0, first
    # Every later push was ended for its pace too, or refused while its worker sat out.
    assert all((e["code"], e["reason"]) == ("CANCELLED", "PUSH_STALLED") for e in ends), ends
    assert {e["limit"] for e in ends} <= {"min_transfer_rate", "sit_out"}
    status = stub.Status(ps_pb2.StatusRequest(), timeout=10)
    assert status.rejected["push_stalled"] == len(ends)
    # Nothing a trickler sent was applied: every applied push is an honest one.
    assert status.applied_pushes == honest.pushes


# 6M fp32 parameters: a 24 MB pull reply, more than gRPC's windows hold for a client that stops reading.
BIG = Layout.from_named_shapes([("w", (6_000_000,))])
BIG_CHANNEL = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]


def _join(stub: ps_pb2_grpc.ParameterServerStub, name: str) -> int:
    request = ps_pb2.JoinRequest(worker_name=name, device="cpu", layout=BIG.to_proto(), layout_hash=BIG.hash)
    return int(stub.Join(request, timeout=10).worker_id)


def _init_requests(worker_id: int, chunks: Iterator[ps_pb2.Chunk], pause_s: float) -> Iterator[ps_pb2.InitRequest]:
    yield ps_pb2.InitRequest(header=ps_pb2.InitHeader(worker_id=worker_id, layout_hash=BIG.hash))
    for chunk in chunks:
        yield ps_pb2.InitRequest(chunk=chunk)
        time.sleep(pause_s)


def test_a_trickled_init_and_a_pull_nobody_reads_are_cancelled_and_counted(start_psserver: StartServer) -> None:
    address = start_psserver("asgd", lr=0.01, config=SERVER_CONFIG)
    with grpc.insecure_channel(address, options=BIG_CHANNEL) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        honest, trickler = _join(stub, "honest"), _join(stub, "trickler")
        assert stub.Init(_init_requests(honest, codec.encode(torch.zeros(BIG.total_length)), 0.0), timeout=30).applied

        # An Init (decoding into a buffer of the shard's size) sent 4 bytes at a time.
        trickle = codec.encode(torch.zeros(BIG.total_length), chunk_bytes=4)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as ended:
            stub.Init(_init_requests(trickler, trickle, INTERVAL_S), timeout=30)
        assert ended.value.code() == grpc.StatusCode.CANCELLED
        assert time.monotonic() - started < GRACE_S + 2 * INTERVAL_S + 1.0

        # A pull whose reader takes one message, then none: the server thread and the version it holds come free.
        replies = stub.Pull(ps_pb2.PullRequest(worker_id=honest), timeout=30)
        next(replies)
        time.sleep(GRACE_S + 2 * IDLE_S)
        with pytest.raises(grpc.RpcError) as cancelled:
            for _ in replies:
                pass
        assert cancelled.value.code() == grpc.StatusCode.CANCELLED

        status = stub.Status(ps_pb2.StatusRequest(), timeout=10)
        assert status.rejected["stream_stalled"] == 2
        # The shard still serves: a pull read at once completes.
        assert sum(1 for _ in stub.Pull(ps_pb2.PullRequest(worker_id=honest), timeout=30)) > 1
