"""A Push stream over real gRPC: a refused or stalled push ends with nothing applied and its receive
buffer given back, and with no wait for a client that sends no more; a whole push is applied as sent."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest
import torch

from psproto import codec, reasons
from psproto.errors import reason_of
from psproto.layout import Layout
from psproto.v1 import ps_pb2, ps_pb2_grpc
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from tests.psworker.live import serving

# 40,000 elements in chunks of 1,024: a push is 40 chunk messages.
LAYOUT = Layout.from_named_shapes([("w", (200, 200))])
CHUNK_BYTES = 4096


def _shard(**changes: object) -> Shard:
    config = ShardConfig(RuleSpec.parse("asgd", {"lr": "1.0"}), chunk_bytes=CHUNK_BYTES)
    return Shard(ShardConfig(**{**config.__dict__, **changes}))


def _join_and_init(stub: ps_pb2_grpc.ParameterServerStub) -> int:
    joined = stub.Join(
        ps_pb2.JoinRequest(worker_name="w", layout=LAYOUT.to_proto(), layout_hash=LAYOUT.hash), timeout=10
    )
    header = ps_pb2.InitHeader(worker_id=joined.worker_id, layout_hash=LAYOUT.hash)
    chunks = codec.encode(torch.zeros(LAYOUT.total_length), chunk_bytes=CHUNK_BYTES)
    stub.Init(iter([ps_pb2.InitRequest(header=header), *(ps_pb2.InitRequest(chunk=c) for c in chunks)]), timeout=10)
    return int(joined.worker_id)


def _push(worker_id: int, chunks: list[ps_pb2.Chunk], hold: threading.Event) -> Iterator[ps_pb2.PushRequest]:
    """A push's header and ``chunks``, then a stream held open (nothing more sent) until ``hold`` is set."""
    header = ps_pb2.PushHeader(
        worker_id=worker_id, push_id=1, base_clock=0, kind=ps_pb2.PAYLOAD_KIND_GRADIENT, layout_hash=LAYOUT.hash
    )
    yield ps_pb2.PushRequest(header=header)
    yield from (ps_pb2.PushRequest(chunk=chunk) for chunk in chunks)
    hold.wait(30)


def _first_chunks(count: int) -> list[ps_pb2.Chunk]:
    return list(codec.encode(torch.ones(LAYOUT.total_length), chunk_bytes=CHUNK_BYTES))[:count]


def _released(shard: Shard) -> None:
    deadline = time.monotonic() + 10
    while shard._receiver.buffers.in_use and time.monotonic() < deadline:
        time.sleep(0.01)
    assert shard._receiver.buffers.in_use == 0


def test_a_chunk_refused_mid_push_is_answered_while_its_client_holds_the_stream_open() -> None:
    shard = _shard()
    hold = threading.Event()
    bad = ps_pb2.Chunk(offset=LAYOUT.total_length, dtype=ps_pb2.DTYPE_FLOAT32, data=bytes(8))  # past the shard's end
    try:
        with serving(shard) as address, grpc.insecure_channel(address) as channel:
            stub = ps_pb2_grpc.ParameterServerStub(channel)
            worker_id = _join_and_init(stub)
            started = time.monotonic()
            with pytest.raises(grpc.RpcError) as refused:
                stub.Push(_push(worker_id, [*_first_chunks(5), bad], hold), timeout=20)
            assert time.monotonic() - started < 10, "the refusal waited for the client's next message"
            assert reason_of(refused.value) is reasons.Reason.CHUNK_OUT_OF_RANGE
            assert "lies outside the shard" in str(refused.value.details())
    finally:
        hold.set()
    assert shard.clock == 0 and bool((shard.params == 0).all())
    _released(shard)


def test_a_push_that_stops_sending_is_ended_as_stalled_with_nothing_applied() -> None:
    shard = _shard(receive_idle_seconds=0.2)
    hold = threading.Event()
    try:
        with serving(shard) as address, grpc.insecure_channel(address) as channel:
            stub = ps_pb2_grpc.ParameterServerStub(channel)
            worker_id = _join_and_init(stub)
            call = stub.Push.future(_push(worker_id, _first_chunks(12), hold), timeout=20)
            deadline = time.monotonic() + 10
            while not call.done() and time.monotonic() < deadline:
                time.sleep(0.1)
                shard.cancel_stalled_pushes()  # what the server's reaper does
            error = call.exception()
            assert isinstance(error, grpc.RpcError) and error.code() is grpc.StatusCode.CANCELLED
    finally:
        hold.set()
    assert shard.rejected == {"push_stalled": 1}
    assert shard.clock == 0 and bool((shard.params == 0).all())
    _released(shard)


def test_a_whole_push_of_many_chunks_is_applied_as_sent() -> None:
    shard = _shard()
    hold = threading.Event()
    hold.set()
    with serving(shard) as address, grpc.insecure_channel(address) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        worker_id = _join_and_init(stub)
        gradient = torch.arange(LAYOUT.total_length, dtype=torch.float32)
        chunks = list(codec.encode(gradient, chunk_bytes=CHUNK_BYTES))
        assert len(chunks) == 40
        assert stub.Push(_push(worker_id, chunks, hold), timeout=20).clock == 1
    assert torch.equal(shard.params, -gradient)
    _released(shard)
