"""Server limits over real gRPC: past each one the request is refused with RESOURCE_EXHAUSTED,
a message that names the flag where the server writes it, and nothing in the shard changes."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import pytest
import torch

from psproto import codec
from psproto.layout import Layout
from psproto.v1 import ps_pb2, ps_pb2_grpc
from psworker.client import ClientConfig
from tests.integration.conftest import StartServer
from tests.integration.test_protocol_integ import LAYOUT, _init, _join, _params, _push

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

Stub = ps_pb2_grpc.ParameterServerStub
StubFor = Callable[[str], Stub]
N = LAYOUT.total_length
# Every call is bounded; a test never waits longer than this for one answer.
TIMEOUT_S = 10.0
# 300 000 fp32 parameters: 1.2 MB, more than one 1 MiB message, so it must travel in chunks.
BIG = Layout.from_named_shapes([("w", (600, 500))])
MIB = 1024 * 1024


def _header(worker_id: int, push_id: int, layout: Layout = LAYOUT) -> ps_pb2.PushHeader:
    return ps_pb2.PushHeader(
        worker_id=worker_id,
        push_id=push_id,
        base_clock=0,
        kind=ps_pb2.PAYLOAD_KIND_GRADIENT,
        layout_hash=layout.hash,
    )


def _requests(header: ps_pb2.PushHeader, chunks: list[ps_pb2.Chunk]) -> Iterator[ps_pb2.PushRequest]:
    yield ps_pb2.PushRequest(header=header)
    for chunk in chunks:
        yield ps_pb2.PushRequest(chunk=chunk)


def _pull(stub: Stub, worker_id: int, length: int) -> tuple[int, torch.Tensor, int]:
    """The clock, the parameters and the largest PullResponse message the server sent."""
    out = torch.empty(length)
    assembler = codec.Assembler(out)
    clock, largest = -1, 0
    for message in stub.Pull(ps_pb2.PullRequest(worker_id=worker_id), timeout=TIMEOUT_S):
        clock = message.clock
        largest = max(largest, message.ByteSize())
        assembler.add(message.chunk)
    assembler.finish()
    return clock, out, largest


@contextmanager
def _refused() -> Iterator[pytest.ExceptionInfo[grpc.RpcError]]:
    """The block must fail with RESOURCE_EXHAUSTED."""
    with pytest.raises(grpc.RpcError) as caught:
        yield caught
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, caught.value.details()


def test_a_message_over_max_message_mb_is_refused_and_changes_nothing(
    start_psserver: StartServer, stub_for: StubFor
) -> None:
    stub = stub_for(start_psserver("asgd", lr=0.1, config={"transport": {"max_message_bytes": 2**20}}))
    worker_id = _join(stub, "w", BIG).worker_id
    values = torch.linspace(-1, 1, BIG.total_length)
    small = MIB // 4

    def init(chunk_bytes: int) -> ps_pb2.InitResponse:
        header = ps_pb2.InitRequest(header=ps_pb2.InitHeader(worker_id=worker_id, layout_hash=BIG.hash))
        chunks = [ps_pb2.InitRequest(chunk=c) for c in codec.encode(values, chunk_bytes=chunk_bytes)]
        return stub.Init(iter([header, *chunks]), timeout=TIMEOUT_S)

    # The whole model in one 1.2 MB message is refused; in 256 KiB chunks it is accepted.
    with _refused():
        init(BIG.total_length * 4)
    assert not stub.Status(ps_pb2.StatusRequest(), timeout=TIMEOUT_S).initialized
    assert init(small).applied
    clock, before, largest = _pull(stub, worker_id, BIG.total_length)
    # The server's own Pull messages stay under its limit too.
    assert clock == 0 and largest <= MIB
    assert torch.equal(before, values)

    gradient = torch.full((BIG.total_length,), 0.5)
    whole = list(codec.encode(gradient, chunk_bytes=BIG.total_length * 4))  # one 1.2 MB chunk
    oversized = ps_pb2.Chunk(offset=0, dtype=ps_pb2.DTYPE_FLOAT32, data=bytes(2 * MIB))  # 2 MiB of zeros
    for push_id, chunks in enumerate([whole, [oversized]], start=1):
        header = _header(worker_id, push_id, BIG)
        # gRPC refuses the message before the server reads it, with gRPC's own message.
        with _refused():
            stub.Push(_requests(header, chunks), timeout=TIMEOUT_S)
        with _refused():
            list(stub.PushPull(_requests(header, chunks), timeout=TIMEOUT_S))
    status = stub.Status(ps_pb2.StatusRequest(), timeout=TIMEOUT_S)
    assert (status.clock, status.applied_pushes) == (0, 0)
    clock, after, _ = _pull(stub, worker_id, BIG.total_length)
    assert clock == 0 and torch.equal(after, before)

    # The same gradient in chunks that fit is applied, once per push, by Push and by PushPull.
    fitting = list(codec.encode(gradient, chunk_bytes=small))
    assert _push(stub, fitting, worker_id=worker_id, push_id=10, layout_hash=BIG.hash).clock == 1
    replies = list(stub.PushPull(_requests(_header(worker_id, 11, BIG), fitting), timeout=TIMEOUT_S))
    assert replies[0].ack.clock == 2 and not replies[0].ack.duplicate
    assert all(r.params.clock == 2 and r.ByteSize() <= MIB for r in replies[1:])
    clock, after, _ = _pull(stub, worker_id, BIG.total_length)
    assert clock == 2
    torch.testing.assert_close(after, values - 2 * 0.1 * gradient)


def test_rpcs_past_max_concurrent_rpcs_are_refused_and_change_nothing(
    start_psserver: StartServer, stub_for: StubFor
) -> None:
    limit = 2
    stub = stub_for(start_psserver("asgd", lr=0.1, config={"transport": {"max_concurrent_rpcs": limit}}))
    worker_id = _join(stub).worker_id
    start = torch.arange(N, dtype=torch.float32)
    assert _init(stub, worker_id, start).applied
    gradient = list(codec.encode(torch.ones(N)))

    # One more Push than the limit, each held open after its header until `release` is set:
    # the server can finish none of them, so at least one is refused, and only with this code.
    release = threading.Event()
    finished: queue.Queue[Any] = queue.Queue()

    def held(push_id: int) -> Iterator[ps_pb2.PushRequest]:
        yield ps_pb2.PushRequest(header=_header(worker_id, push_id))
        release.wait(TIMEOUT_S)
        for chunk in gradient:
            yield ps_pb2.PushRequest(chunk=chunk)

    calls: list[Any] = []  # grpc futures that are also grpc.Call
    try:
        for push_id in range(1, limit + 2):
            call = stub.Push.future(held(push_id), timeout=2 * TIMEOUT_S)
            call.add_done_callback(finished.put)
            calls.append(call)
        first = finished.get(timeout=TIMEOUT_S)
        assert first.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, first.details()
    finally:
        release.set()
    clocks: list[int] = []
    for call in calls:
        try:
            clocks.append(call.result(timeout=TIMEOUT_S).clock)
        except grpc.RpcError:
            assert call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, call.details()
    served = len(clocks)
    assert 1 <= served <= limit and sorted(clocks) == list(range(1, served + 1)), clocks

    # Only the served pushes were applied, and the server goes on serving normally.
    clock, params = _params(stub, worker_id)
    assert clock == served
    torch.testing.assert_close(params, start - 0.1 * served)
    assert _push(stub, gradient, worker_id=worker_id, push_id=100).clock == served + 1
    status = stub.Status(ps_pb2.StatusRequest(), timeout=TIMEOUT_S)
    assert status.applied_pushes == served + 1
    assert [w.worker_name for w in status.workers] == ["w"]


def test_a_join_past_max_workers_is_refused_and_the_first_worker_keeps_working(
    start_psserver: StartServer, stub_for: StubFor
) -> None:
    stub = stub_for(start_psserver("asgd", lr=0.1, config={"shard": {"max_workers": 1}}))
    worker_id = _join(stub, "first").worker_id
    start = torch.arange(N, dtype=torch.float32)
    assert _init(stub, worker_id, start).applied
    gradient = list(codec.encode(torch.ones(N)))
    assert _push(stub, gradient, worker_id=worker_id, push_id=1).clock == 1

    for name, role in [("second", ps_pb2.ROLE_WORKER), ("watcher", ps_pb2.ROLE_OBSERVER)]:
        with _refused() as caught:
            _join(stub, name, role=role)
        assert "shard.max_workers" in (caught.value.details() or "")
    status = stub.Status(ps_pb2.StatusRequest(), timeout=TIMEOUT_S)
    assert [w.worker_name for w in status.workers] == ["first"]
    assert status.rejected["limit_reached"] == 2

    # The first worker pushes and pulls as before.
    assert _push(stub, gradient, worker_id=worker_id, push_id=2).clock == 2
    clock, params = _params(stub, worker_id)
    assert clock == 2
    torch.testing.assert_close(params, start - 0.2)
    # Re-joining under its own name is not a new worker.
    rejoined = stub.Join(
        ps_pb2.JoinRequest(
            worker_name="first", device="cpu", layout=LAYOUT.to_proto(), layout_hash=LAYOUT.hash, resume=True
        ),
        timeout=TIMEOUT_S,
    )
    assert rejoined.clock == 2
    assert _push(stub, gradient, worker_id=rejoined.worker_id, push_id=3).clock == 3
    assert [w.worker_name for w in stub.Status(ps_pb2.StatusRequest(), timeout=TIMEOUT_S).workers] == ["first"]


def test_a_model_past_max_parameters_is_refused_and_changes_nothing(
    start_psserver: StartServer, stub_for: StubFor
) -> None:
    limit = N - 1
    stub = stub_for(start_psserver("asgd", lr=0.1, config={"shard": {"max_parameters": limit}}))
    with _refused() as caught:
        _join(stub)
    details = caught.value.details() or ""
    assert "shard.max_parameters" in details and f"{N} parameters" in details, details
    status = stub.Status(ps_pb2.StatusRequest(), timeout=TIMEOUT_S)
    assert (status.layout_hash, status.shard_length, status.initialized, len(status.workers)) == ("", 0, False, 0)
    assert status.rejected["limit_reached"] == 1

    # The refused model left no layout behind: a model within the limit joins and trains.
    fits = Layout.from_named_shapes([("w", (limit,))])
    worker_id = _join(stub, "small", fits).worker_id
    assert _init(stub, worker_id, torch.zeros(limit), layout_hash=fits.hash).applied
    header = _header(worker_id, 1, fits)
    reply = stub.Push(_requests(header, list(codec.encode(torch.ones(limit)))), timeout=TIMEOUT_S)
    assert reply.clock == 1
    clock, params, _ = _pull(stub, worker_id, limit)
    assert clock == 1
    torch.testing.assert_close(params, torch.full((limit,), -0.1))


def _push_until_receiving_is_full(
    stub: ps_pb2_grpc.ParameterServerStub, gradient: list[ps_pb2.Chunk], worker_id: int
) -> int:
    """Push as ``worker_id`` until a push is refused for shard.max_receiving_pushes; the pushes applied before."""
    from psproto.errors import limit_of, reason_of
    from psproto.reasons import Reason, TransientLimit

    pause = threading.Event()
    applied = 0
    while True:  # the holder's header may still be on its way: its push counts once it arrives
        try:
            _push(stub, gradient, worker_id=worker_id, push_id=applied + 1)
            applied += 1
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error.details()
            assert reason_of(error) is Reason.LIMIT_REACHED
            assert limit_of(error) == TransientLimit.RECEIVING_PUSHES.value
            assert "shard.max_receiving_pushes" in (error.details() or "")
            return applied
        assert applied < 100, "no push was refused while another was open"
        pause.wait(0.05)


def test_a_push_past_max_receiving_pushes_is_refused_with_its_limit_and_psworker_sends_it_again(
    start_psserver: StartServer, stub_for: StubFor
) -> None:
    from psworker.client import PSClient
    from psworker.sessions import RetryPolicy

    address = start_psserver("asgd", lr=0.1, config={"shard": {"max_receiving_pushes": 1}})
    stub = stub_for(address)
    holder = _join(stub, name="holder").worker_id
    start = torch.arange(N, dtype=torch.float32)
    assert _init(stub, holder, start).applied
    gradient = list(codec.encode(torch.ones(N)))

    # The holder's push stays open after its header until `release`: the one push the cap allows.
    release = threading.Event()
    opened = threading.Event()

    def held() -> Iterator[ps_pb2.PushRequest]:
        yield ps_pb2.PushRequest(header=_header(holder, 1))
        opened.set()
        release.wait(TIMEOUT_S)
        for chunk in gradient:
            yield ps_pb2.PushRequest(chunk=chunk)

    holding = stub.Push.future(held(), timeout=2 * TIMEOUT_S)
    try:
        assert opened.wait(TIMEOUT_S)
        applied_before = _push_until_receiving_is_full(stub, gradient, _join(stub, name="other").worker_id)
        assert _params(stub, holder)[0] == applied_before  # the refused push changed nothing
        # A psworker client retries it: its push goes through once the holder's stream ends.
        with PSClient(
            [address], LAYOUT, name="retrying", config=ClientConfig(retry=RetryPolicy(give_up_seconds=20.0))
        ) as client:
            pushed: queue.Queue[Any] = queue.Queue()
            pusher = threading.Thread(target=lambda: pushed.put(client.push(torch.ones(N))))
            pusher.start()
            pusher.join(0.5)
            assert pusher.is_alive(), "the push should wait behind the holder's open stream"
            release.set()
            pusher.join(TIMEOUT_S)
            (result,) = pushed.get(timeout=TIMEOUT_S)
            assert client.stats.retries >= 1
        assert holding.result(timeout=TIMEOUT_S).clock > applied_before
        assert result.clock > applied_before
    finally:
        release.set()
    clock, params = _params(stub, holder)
    assert clock == applied_before + 2
    torch.testing.assert_close(params, start - 0.1 * clock)
