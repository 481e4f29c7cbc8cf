"""Every refusal a real psserver sends carries its reason as data: a ``google.rpc.ErrorInfo`` in
domain ``hetps`` beside the status code (docs/protocol.md, "Errors"). Each case here provokes
one reason over real gRPC and checks the code, the reason and the domain, never the message."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import torch

from psproto import codec
from psproto.errors import DOMAIN, Reason, error_info, reason_of
from psproto.layout import Layout
from psproto.v1 import ps_pb2, ps_pb2_grpc
from tests.integration.conftest import StartServer
from tests.integration.test_protocol_integ import LAYOUT, _init, _join, _push, _raw

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

Stub = ps_pb2_grpc.ParameterServerStub
N = LAYOUT.total_length
TIMEOUT_S = 10.0
TOKEN = "reasons-token"
OTHER_MODEL = Layout.from_named_shapes([("w", (3, 3))])


def _assert_refused(call: Callable[[], object], code: grpc.StatusCode, reason: Reason) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call()
    error = caught.value
    info = error_info(error)
    assert (error.code(), reason_of(error)) == (code, reason), error.details()
    assert info is not None and info.domain == DOMAIN == "hetps" and info.reason == reason.value
    return error


def _pull(stub: Stub, worker_id: int) -> list[ps_pb2.PullResponse]:
    return list(stub.Pull(ps_pb2.PullRequest(worker_id=worker_id), timeout=TIMEOUT_S))


def _ones() -> list[ps_pb2.Chunk]:
    return list(codec.encode(torch.ones(N)))


@pytest.fixture
def channel(start_psserver: StartServer) -> Iterator[grpc.Channel]:
    address = start_psserver("asgd", lr=0.1, config={"shard": {"max_workers": 2}})
    with grpc.insecure_channel(address) as opened:
        yield opened


def test_the_shards_refusals_carry_their_reasons(channel: grpc.Channel) -> None:
    stub = ps_pb2_grpc.ParameterServerStub(channel)
    worker_id = _join(stub, "w").worker_id

    # Before any Init.
    _assert_refused(lambda: _pull(stub, worker_id), grpc.StatusCode.FAILED_PRECONDITION, Reason.NOT_INITIALIZED)
    _assert_refused(
        lambda: stub.Checkpoint(ps_pb2.CheckpointRequest(), timeout=TIMEOUT_S),
        grpc.StatusCode.FAILED_PRECONDITION,
        Reason.CHECKPOINTS_OFF,
    )
    assert _init(stub, worker_id, torch.zeros(N)).applied
    _assert_refused(
        lambda: _init(stub, worker_id, torch.zeros(N), layout_hash="cd" * 32),
        grpc.StatusCode.ALREADY_EXISTS,
        Reason.INIT_CONFLICT,
    )

    # Membership.
    _assert_refused(lambda: _pull(stub, 12345), grpc.StatusCode.NOT_FOUND, Reason.UNKNOWN_WORKER)
    _assert_refused(
        lambda: _join(stub, "intruder", OTHER_MODEL), grpc.StatusCode.FAILED_PRECONDITION, Reason.LAYOUT_MISMATCH
    )
    _assert_refused(lambda: _join(stub, "w"), grpc.StatusCode.ALREADY_EXISTS, Reason.NAME_IN_USE)
    _join(stub, "second")
    _assert_refused(lambda: _join(stub, "third"), grpc.StatusCode.RESOURCE_EXHAUSTED, Reason.LIMIT_REACHED)

    # Pushes: the two OUT_OF_RANGE situations differ by reason.
    def push(chunks: list[ps_pb2.Chunk], **header: object) -> Callable[[], object]:
        return lambda: _push(stub, chunks, worker_id=worker_id, **header)

    _assert_refused(push(_ones(), base_clock=5), grpc.StatusCode.OUT_OF_RANGE, Reason.FUTURE_CLOCK)
    past_the_end = [_raw(0, [1.0] * 10), _raw(15, [1.0] * 10)]
    _assert_refused(push(past_the_end), grpc.StatusCode.OUT_OF_RANGE, Reason.CHUNK_OUT_OF_RANGE)
    _assert_refused(push([_raw(0, [1.0] * (N - 3))]), grpc.StatusCode.DATA_LOSS, Reason.WRONG_LENGTH)
    _assert_refused(push([_raw(0, [1.0] * N, dtype=17)]), grpc.StatusCode.UNIMPLEMENTED, Reason.UNKNOWN_DTYPE)
    nan = [_raw(0, [1.0] * (N - 1) + [float("nan")])]
    _assert_refused(push(nan), grpc.StatusCode.INVALID_ARGUMENT, Reason.NON_FINITE)
    _assert_refused(push(_ones(), layout_hash="ab" * 32), grpc.StatusCode.FAILED_PRECONDITION, Reason.LAYOUT_MISMATCH)

    # Malformed requests, refused by the transport before the shard sees them.
    headerless = [ps_pb2.PushRequest(chunk=chunk) for chunk in _ones()]
    _assert_refused(
        lambda: stub.Push(iter(headerless), timeout=TIMEOUT_S), grpc.StatusCode.INVALID_ARGUMENT, Reason.BAD_REQUEST
    )
    raw_join = channel.unary_unary(
        "/psproto.v1.ParameterServer/Join", request_serializer=None, response_deserializer=None
    )
    _assert_refused(
        lambda: raw_join(b"\xff\xff\xff not a message", timeout=TIMEOUT_S),
        grpc.StatusCode.INVALID_ARGUMENT,
        Reason.BAD_REQUEST,
    )

    # Nothing above changed the shard; every refusal was counted under its reason's label.
    status = stub.Status(ps_pb2.StatusRequest(), timeout=TIMEOUT_S)
    assert status.clock == 0 and status.applied_pushes == 0
    assert status.rejected[Reason.FUTURE_CLOCK.label] == 1
    assert status.rejected[Reason.CHUNK_OUT_OF_RANGE.label] == 1
    assert status.rejected[Reason.BAD_REQUEST.label] == 2


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc, a directory where no file can be created")
def test_the_token_check_and_a_failed_checkpoint_carry_their_reasons(
    start_psserver: StartServer, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    checkpoints = tmp_path / "checkpoints"
    address = start_psserver(
        "asgd", lr=0.1, extra_args=("--auth-token-file", str(token), "--checkpoint-dir", str(checkpoints))
    )
    with grpc.insecure_channel(address) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        _assert_refused(
            lambda: stub.Status(ps_pb2.StatusRequest(), timeout=TIMEOUT_S),
            grpc.StatusCode.UNAUTHENTICATED,
            Reason.UNAUTHENTICATED,
        )
        authorized = (("authorization", f"Bearer {TOKEN}"),)
        # The checkpoint directory becomes a link to a file system nobody can create files in.
        shutil.rmtree(checkpoints, ignore_errors=True)
        checkpoints.symlink_to("/proc", target_is_directory=True)
        try:
            _assert_refused(
                lambda: stub.Checkpoint(ps_pb2.CheckpointRequest(), timeout=30, metadata=authorized),
                grpc.StatusCode.INTERNAL,
                Reason.CHECKPOINT_FAILED,
            )
        finally:
            checkpoints.unlink()
            checkpoints.mkdir()  # so the final checkpoint at shutdown succeeds
