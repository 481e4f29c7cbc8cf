"""The wire contract over real gRPC: refusals and their codes, health, reflection, a proto-only client."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from psproto import codec
from psproto.layout import Layout
from psproto.v1 import ps_pb2, ps_pb2_grpc
from tests.integration.conftest import StartServer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
LAYOUT = Layout.from_named_shapes([("w", (4, 4)), ("b", (4,))])
Stub = ps_pb2_grpc.ParameterServerStub


def _join(stub: Stub, name: str = "w", layout: Layout = LAYOUT, role: int = ps_pb2.ROLE_WORKER) -> ps_pb2.JoinResponse:
    return stub.Join(
        ps_pb2.JoinRequest(
            worker_name=name,
            device="cpu",
            role=role,  # type: ignore[arg-type]
            layout=layout.to_proto(),
            layout_hash=layout.hash,
        )
    )


def _init(stub: Stub, worker_id: int, values: torch.Tensor, layout_hash: str = LAYOUT.hash) -> ps_pb2.InitResponse:
    def messages() -> Iterator[ps_pb2.InitRequest]:
        yield ps_pb2.InitRequest(header=ps_pb2.InitHeader(worker_id=worker_id, layout_hash=layout_hash))
        for chunk in codec.encode(values):
            yield ps_pb2.InitRequest(chunk=chunk)

    return stub.Init(messages())


def _push_header(**fields: object) -> ps_pb2.PushHeader:
    """A PushHeader for a first gradient push of LAYOUT (push id 1, base clock 0); ``fields`` override."""
    defaults: dict[str, object] = {
        "push_id": 1,
        "base_clock": 0,
        "kind": ps_pb2.PAYLOAD_KIND_GRADIENT,
        "layout_hash": LAYOUT.hash,
    }
    return ps_pb2.PushHeader(**{**defaults, **fields})  # type: ignore[arg-type]


def _push(stub: Stub, chunks: list[ps_pb2.Chunk], **header: object) -> ps_pb2.PushResponse:
    def messages() -> Iterator[ps_pb2.PushRequest]:
        yield ps_pb2.PushRequest(header=_push_header(**header))
        for chunk in chunks:
            yield ps_pb2.PushRequest(chunk=chunk)

    return stub.Push(messages())


def _params(stub: Stub, worker_id: int) -> tuple[int, torch.Tensor]:
    out = torch.empty(LAYOUT.total_length)
    assembler = codec.Assembler(out)
    clock = -1
    for message in stub.Pull(ps_pb2.PullRequest(worker_id=worker_id)):
        clock = message.clock
        assembler.add(message.chunk)
    assembler.finish()
    return clock, out


def _raw(offset: int, values: list[float], dtype: int = ps_pb2.DTYPE_FLOAT32) -> ps_pb2.Chunk:
    chunk = ps_pb2.Chunk(offset=offset)
    chunk.dtype = dtype  # type: ignore[assignment]
    chunk.data = torch.tensor(values, dtype=torch.float32).numpy().tobytes()
    return chunk


@pytest.fixture
def live(start_psserver: StartServer, stub_for: Callable[[str], Stub]) -> tuple[Stub, int]:
    stub = stub_for(start_psserver("asgd", lr=0.1))
    worker_id = _join(stub).worker_id
    assert _init(stub, worker_id, torch.arange(20, dtype=torch.float32)).applied
    return stub, worker_id


N = LAYOUT.total_length
CASES: dict[str, tuple[grpc.StatusCode, dict[str, object], list[ps_pb2.Chunk] | None]] = {
    "unknown worker": (grpc.StatusCode.NOT_FOUND, {"worker_id": 12345}, None),
    "layout hash mismatch": (grpc.StatusCode.FAILED_PRECONDITION, {"layout_hash": "ab" * 32}, None),
    "wrong total length": (grpc.StatusCode.DATA_LOSS, {}, [_raw(0, [1.0] * (N - 3))]),
    "chunk out of range": (grpc.StatusCode.OUT_OF_RANGE, {}, [_raw(0, [1.0] * 10), _raw(15, [1.0] * 10)]),
    "unknown dtype": (grpc.StatusCode.UNIMPLEMENTED, {}, [_raw(0, [1.0] * N, dtype=17)]),
    "nan in gradient": (grpc.StatusCode.INVALID_ARGUMENT, {}, [_raw(0, [1.0] * (N - 1) + [float("nan")])]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_invalid_push_gets_its_own_code_and_changes_nothing(live: tuple[Stub, int], case: str) -> None:
    stub, worker_id = live
    code, header, chunks = CASES[case]
    before = _params(stub, worker_id)
    header = {"worker_id": worker_id, **header}
    with pytest.raises(grpc.RpcError) as caught:
        _push(stub, chunks if chunks is not None else list(codec.encode(torch.ones(N))), **header)
    assert caught.value.code() == code, caught.value.details()
    assert len(caught.value.details() or "") > 20
    after = _params(stub, worker_id)
    assert after[0] == before[0]
    assert torch.equal(after[1], before[1])


def test_distinct_codes_for_distinct_failures() -> None:
    codes = [code for code, _, _ in CASES.values()] + [grpc.StatusCode.ALREADY_EXISTS]
    assert len(set(codes)) == len(codes)


def test_a_repeated_push_id_is_acknowledged_once(live: tuple[Stub, int]) -> None:
    stub, worker_id = live
    gradient = list(codec.encode(torch.ones(N)))
    first = _push(stub, gradient, worker_id=worker_id, push_id=5)
    second = _push(stub, gradient, worker_id=worker_id, push_id=5)
    assert not first.duplicate and second.duplicate
    assert second.clock == first.clock == 1
    clock, params = _params(stub, worker_id)
    assert clock == 1
    torch.testing.assert_close(params, torch.arange(20, dtype=torch.float32) - 0.1)


def test_init_with_another_layout_is_already_exists(live: tuple[Stub, int]) -> None:
    stub, worker_id = live
    with pytest.raises(grpc.RpcError) as caught:
        _init(stub, worker_id, torch.zeros(N), layout_hash="cd" * 32)
    assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert torch.equal(_params(stub, worker_id)[1], torch.arange(20, dtype=torch.float32))


def test_join_with_another_model_is_failed_precondition(live: tuple[Stub, int]) -> None:
    stub, _ = live
    other = Layout.from_named_shapes([("w", (3, 3))])
    with pytest.raises(grpc.RpcError) as caught:
        _join(stub, "intruder", other)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "same model" in (caught.value.details() or "")
    status = stub.Status(ps_pb2.StatusRequest())
    assert [w.worker_name for w in status.workers] == ["w"]
    assert status.rejected["layout_mismatch"] == 1


def test_a_stream_without_a_header_is_invalid_argument(live: tuple[Stub, int]) -> None:
    stub, _ = live
    with pytest.raises(grpc.RpcError) as caught:
        stub.Push(iter([ps_pb2.PushRequest(chunk=_raw(0, [1.0] * N))]))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_push_pull_answers_with_ack_then_parameters(live: tuple[Stub, int]) -> None:
    stub, worker_id = live

    def messages() -> Iterator[ps_pb2.PushRequest]:
        yield ps_pb2.PushRequest(
            header=ps_pb2.PushHeader(
                worker_id=worker_id,
                push_id=1,
                base_clock=0,
                kind=ps_pb2.PAYLOAD_KIND_GRADIENT,
                layout_hash=LAYOUT.hash,
                pull_dtype=ps_pb2.DTYPE_BFLOAT16,
            )
        )
        for chunk in codec.encode(torch.ones(N)):
            yield ps_pb2.PushRequest(chunk=chunk)

    replies = list(stub.PushPull(messages()))
    assert replies[0].WhichOneof("body") == "ack" and replies[0].ack.clock == 1
    assert all(r.WhichOneof("body") == "params" and r.params.clock == 1 for r in replies[1:])
    assert {r.params.chunk.dtype for r in replies[1:]} == {ps_pb2.DTYPE_BFLOAT16}


def test_health_and_reflection(start_psserver: StartServer) -> None:
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    address = start_psserver()
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "psproto.v1.ParameterServer"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        response = next(iter(reflection.ServerReflectionInfo(iter([request]), timeout=5)))
        names = {s.name for s in response.list_services_response.service}
        assert {"psproto.v1.ParameterServer", "grpc.health.v1.Health"} <= names


def test_a_client_built_only_from_the_proto(start_psserver: StartServer, tmp_path: Path) -> None:
    address = start_psserver("asgd", lr=0.5)
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{REPO / 'protos' / 'psproto' / 'v1'}",
            f"--python_out={stubs}",
            f"--grpc_python_out={stubs}",
            "ps.proto",
        ],
        check=True,
        timeout=60,
    )
    result = subprocess.run(
        [sys.executable, str(REPO / "tests" / "integration" / "proto_only_client.py"), str(stubs), address],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "proto-only client OK" in result.stdout
