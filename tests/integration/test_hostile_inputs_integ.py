"""Requests a careless or hostile client can send, over real gRPC: each is refused with its own
code and a message that says what to fix, and the shard (clock, parameters, workers) stays as it was."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest
import torch

from psproto import codec
from psproto.layout import Layout
from psproto.v1 import ps_pb2, ps_pb2_grpc
from tests.integration.conftest import StartServer
from tests.integration.test_limits_integ import _header
from tests.integration.test_protocol_integ import LAYOUT, _init, _join, _params, _push

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

Stub = ps_pb2_grpc.ParameterServerStub
StubFor = Callable[[str], Stub]
N = LAYOUT.total_length
TIMEOUT_S = 10.0


@pytest.fixture
def live(start_psserver: StartServer, stub_for: StubFor) -> tuple[Stub, int]:
    stub = stub_for(start_psserver("asgd", lr=0.1))
    worker_id = _join(stub).worker_id
    assert _init(stub, worker_id, torch.arange(N, dtype=torch.float32)).applied
    return stub, worker_id


def _snapshot(stub: Stub, worker_id: int) -> tuple[int, torch.Tensor, list[tuple[int, str, int]], int]:
    """What a refused request must leave alone: clock, parameters, the workers and applied pushes."""
    clock, params = _params(stub, worker_id)
    status = stub.Status(ps_pb2.StatusRequest(), timeout=TIMEOUT_S)
    workers = sorted((w.worker_id, w.worker_name, w.pushes) for w in status.workers)
    return clock, params, workers, status.applied_pushes


def _assert_unchanged(
    before: tuple[int, torch.Tensor, list[tuple[int, str, int]], int],
    after: tuple[int, torch.Tensor, list[tuple[int, str, int]], int],
) -> None:
    assert before[0] == after[0]
    assert torch.equal(before[1], after[1])
    assert before[2] == after[2] and before[3] == after[3]


def _refused(call: Callable[[], object], code: grpc.StatusCode, words: str) -> str:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    assert caught.value.code() == code, caught.value.details()
    details = caught.value.details() or ""
    assert words in details, details
    return details


def test_a_push_pull_asking_for_an_unknown_dtype_is_refused_before_its_push_is_applied(
    live: tuple[Stub, int],
) -> None:
    stub, worker_id = live
    before = _snapshot(stub, worker_id)

    def push_pull() -> list[ps_pb2.PushPullResponse]:
        header = _header(worker_id, 7)
        header.pull_dtype = 9  # type: ignore[assignment]

        def messages() -> Iterator[ps_pb2.PushRequest]:
            yield ps_pb2.PushRequest(header=header)
            for chunk in codec.encode(torch.ones(N)):
                yield ps_pb2.PushRequest(chunk=chunk)

        return list(stub.PushPull(messages(), timeout=TIMEOUT_S))

    _refused(push_pull, grpc.StatusCode.UNIMPLEMENTED, "unknown chunk dtype 9")
    _assert_unchanged(before, _snapshot(stub, worker_id))
    # The same push id with a valid dtype is applied once, not recognised as a retry.
    reply = _push(stub, list(codec.encode(torch.ones(N))), worker_id=worker_id, push_id=7)
    assert (reply.clock, reply.duplicate) == (1, False)


def test_a_reserved_pull_is_refused_where_the_rule_takes_none(live: tuple[Stub, int]) -> None:
    stub, worker_id = live
    observer = _join(stub, "dashboard", role=ps_pb2.ROLE_OBSERVER).worker_id
    for reader, words in (
        (worker_id, "rule asgd with these options takes no exclusive pulls"),
        (observer, "observers"),
    ):
        _refused(
            lambda reader=reader: list(  # type: ignore[misc]
                stub.Pull(ps_pb2.PullRequest(worker_id=reader, reserve=True), timeout=TIMEOUT_S)
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            words,
        )
    # Nothing holds the shard: a push lands at once.
    assert _push(stub, list(codec.encode(torch.ones(N))), worker_id=worker_id).clock == 1


def _join_request(name: str, layout: Layout, **fields: object) -> ps_pb2.JoinRequest:
    request = ps_pb2.JoinRequest(worker_name=name, device="cpu", layout=layout.to_proto(), layout_hash=layout.hash)
    for key, value in fields.items():
        setattr(request, key, value)
    return request


@pytest.mark.parametrize(
    ("case", "request_fields", "words"),
    [
        ("a name with the hash's separators", {"tensors": [("a:2;b", [2])]}, "names may not contain"),
        ("no parameters", {"tensors": [("w", [0, 5])]}, "holds no parameters"),
        ("a 5 MiB device", {"device": "x" * (5 * 1024 * 1024)}, "device has 5242880 characters"),
        ("a 1,000-character name", {"worker_name": "n" * 1000}, "worker_name has 1000 characters"),
        ("an unknown role", {"role": 99}, "role 99 is unknown"),
    ],
)
def test_a_join_that_would_mix_models_or_bloat_status_is_refused(
    start_psserver: StartServer, stub_for: StubFor, case: str, request_fields: dict[str, object], words: str
) -> None:
    stub = stub_for(start_psserver("asgd", lr=0.1, config={"transport": {"max_message_bytes": 16 * 2**20}}))
    fields = dict(request_fields)
    tensors = fields.pop("tensors", None)
    layout = LAYOUT
    request = _join_request("w", layout, **{k: v for k, v in fields.items() if k != "worker_name"})
    if "worker_name" in fields:
        request.worker_name = str(fields["worker_name"])
    if tensors is not None:
        # A layout the worker could not build itself: written straight into the message.
        del request.layout.tensors[:]
        for name, shape in tensors:  # type: ignore[attr-defined]
            request.layout.tensors.add(name=name, shape=shape)
        request.layout_hash = ""
    _refused(lambda: stub.Join(request, timeout=TIMEOUT_S), grpc.StatusCode.INVALID_ARGUMENT, words)
    # No model was adopted and nobody joined: the real model still joins.
    status = stub.Status(ps_pb2.StatusRequest(), timeout=TIMEOUT_S)
    assert (status.layout_hash, list(status.workers)) == ("", [])
    assert status.rejected["bad_request"] == 1
    assert _join(stub).shard_length == N


def test_two_models_whose_hash_text_would_collide_cannot_mix(start_psserver: StartServer, stub_for: StubFor) -> None:
    stub = stub_for(start_psserver("asgd", lr=0.1))
    genuine = Layout.from_named_shapes([("a", (2,)), ("b", (2,))])
    assert _join(stub, "first", genuine).shard_length == 4
    forged = _join_request("second", genuine)
    del forged.layout.tensors[:]
    forged.layout.tensors.add(name="a:2;b", shape=[2])  # the text "a:2;b:2|1", like the genuine model's
    forged.layout_hash = genuine.hash
    _refused(lambda: stub.Join(forged, timeout=TIMEOUT_S), grpc.StatusCode.INVALID_ARGUMENT, "names may not contain")


def test_a_second_running_worker_cannot_take_a_joined_workers_name(live: tuple[Stub, int]) -> None:
    stub, worker_id = live
    assert _push(stub, list(codec.encode(torch.ones(N))), worker_id=worker_id, push_id=7).clock == 1
    before = _snapshot(stub, worker_id)
    _refused(lambda: _join(stub, "w"), grpc.StatusCode.ALREADY_EXISTS, "worker name 'w' is in use by joined worker")
    _assert_unchanged(before, _snapshot(stub, worker_id))
    # The worker itself, re-joining with resume, keeps its push ids: its retry is not applied twice.
    again = stub.Join(_join_request("w", LAYOUT, resume=True), timeout=TIMEOUT_S).worker_id
    retry = _push(stub, list(codec.encode(torch.ones(N))), worker_id=again, push_id=7)
    assert retry.duplicate and _params(stub, again)[0] == 1


def test_heartbeat_stats_and_push_metadata_are_bounded(live: tuple[Stub, int]) -> None:
    stub, worker_id = live
    before = _snapshot(stub, worker_id)
    many = {f"k{i}": 1.0 for i in range(65)}
    _refused(
        lambda: stub.Heartbeat(ps_pb2.HeartbeatRequest(worker_id=worker_id, stats=many), timeout=TIMEOUT_S),
        grpc.StatusCode.INVALID_ARGUMENT,
        "stats has 65 entries",
    )
    long_key = {"k" * 129: 1.0}
    _refused(
        lambda: stub.Heartbeat(ps_pb2.HeartbeatRequest(worker_id=worker_id, stats=long_key), timeout=TIMEOUT_S),
        grpc.StatusCode.INVALID_ARGUMENT,
        "more than the 128 allowed",
    )
    # A diverging worker may report a NaN loss: that heartbeat still keeps its lease.
    stub.Heartbeat(ps_pb2.HeartbeatRequest(worker_id=worker_id, stats={"loss": math.nan}), timeout=TIMEOUT_S)
    _refused(
        lambda: _push(stub, list(codec.encode(torch.ones(N))), worker_id=worker_id, metadata={"pi_median": math.nan}),
        grpc.StatusCode.INVALID_ARGUMENT,
        "metadata['pi_median'] is nan",
    )
    _assert_unchanged(before, _snapshot(stub, worker_id))


def test_observers_cannot_initialise_the_parameters(start_psserver: StartServer, stub_for: StubFor) -> None:
    stub = stub_for(start_psserver("asgd", lr=0.1))
    observer = _join(stub, "dashboard", role=ps_pb2.ROLE_OBSERVER).worker_id
    _refused(lambda: _init(stub, observer, torch.ones(N)), grpc.StatusCode.INVALID_ARGUMENT, "observers cannot Init")
    assert not stub.Status(ps_pb2.StatusRequest(), timeout=TIMEOUT_S).initialized


def test_a_chunk_of_a_partial_element_is_a_malformed_request(live: tuple[Stub, int]) -> None:
    stub, worker_id = live
    before = _snapshot(stub, worker_id)
    chunk = ps_pb2.Chunk(offset=0, data=torch.ones(N).numpy().tobytes() + b"\x00\x00")
    _refused(lambda: _push(stub, [chunk], worker_id=worker_id), grpc.StatusCode.INVALID_ARGUMENT, "not a multiple of 4")
    _assert_unchanged(before, _snapshot(stub, worker_id))


def test_refusals_made_before_the_shard_sees_a_request_are_counted(live: tuple[Stub, int]) -> None:
    stub, _ = live

    def headerless() -> ps_pb2.PushResponse:
        return stub.Push(iter([ps_pb2.PushRequest(chunk=c) for c in codec.encode(torch.ones(N))]), timeout=TIMEOUT_S)

    _refused(headerless, grpc.StatusCode.INVALID_ARGUMENT, "must start with a PushHeader")
    _refused(lambda: stub.Push(iter([]), timeout=TIMEOUT_S), grpc.StatusCode.INVALID_ARGUMENT, "PushHeader")
    assert stub.Status(ps_pb2.StatusRequest(), timeout=TIMEOUT_S).rejected["bad_request"] == 2


def test_a_push_that_stalls_holding_the_receive_buffer_is_cancelled_and_frees_it(
    start_psserver: StartServer, stub_for: StubFor
) -> None:
    address = start_psserver(
        "asgd", lr=0.1, config={"shard": {"receive_buffers": 1, "receive_idle_seconds": 1.0, "lease_seconds": 60.0}}
    )
    stub = stub_for(address)
    staller = _join(stub, "staller").worker_id
    honest = _join(stub, "honest").worker_id
    assert _init(stub, staller, torch.zeros(N)).applied
    chunks = list(codec.encode(torch.ones(N), chunk_bytes=16))
    assert len(chunks) > 1
    release = threading.Event()
    outcome: list[BaseException | ps_pb2.PushResponse] = []

    def stall() -> None:
        def messages() -> Iterator[ps_pb2.PushRequest]:
            yield ps_pb2.PushRequest(header=_header(staller, 1))
            yield ps_pb2.PushRequest(chunk=chunks[0])  # takes the only receive buffer
            release.wait(30)  # then sends nothing

        try:
            outcome.append(stub.Push(messages(), timeout=30))
        except grpc.RpcError as error:
            outcome.append(error)

    thread = threading.Thread(target=stall, daemon=True)
    thread.start()
    time.sleep(0.3)
    started = time.monotonic()
    reply = _push(stub, chunks, worker_id=honest)  # waits for the buffer until the staller is cancelled
    waited = time.monotonic() - started
    release.set()
    thread.join(10)
    assert reply.clock == 1 and not reply.duplicate
    assert 0.5 < waited < 20, waited
    assert isinstance(outcome[0], grpc.RpcError) and outcome[0].code() == grpc.StatusCode.CANCELLED
    clock, params = _params(stub, honest)
    assert clock == 1 and torch.allclose(params, torch.full((N,), -0.1))
    assert stub.Status(ps_pb2.StatusRequest(), timeout=TIMEOUT_S).rejected["push_stalled"] == 1
