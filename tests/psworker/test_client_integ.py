"""PSClient against a real in-process server on 127.0.0.1."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

import grpc
import pytest
import torch

from psproto import codec
from psproto.layout import Layout
from psproto.v1 import ps_pb2, ps_pb2_grpc
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psserver.rpc.server import RunningServer, start_server
from psworker.client import ClientConfig, PSClient
from psworker.sessions import ShardSession

LAYOUT = Layout.from_named_shapes([("w", [4])], 1)


@pytest.fixture
def served() -> Iterator[tuple[Shard, RunningServer]]:
    shard = Shard(ShardConfig(RuleSpec.parse("asgd", {"lr": "0.1"})))
    running = start_server(shard, "127.0.0.1:0")
    try:
        yield shard, running
    finally:
        running.stop(0)


def test_a_call_refused_while_the_client_closes_does_not_join_again(served: tuple[Shard, RunningServer]) -> None:
    shard, running = served
    address = f"127.0.0.1:{running.port}"
    client = PSClient([address], LAYOUT, name="stopping")
    client.init(torch.zeros(4))
    joined = client.sessions[0].worker_id
    calls: list[int] = []
    with grpc.insecure_channel(address) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)

        def in_flight(session: object) -> None:
            calls.append(joined)
            client.close()  # Ctrl-C in the main thread: Leave, while this call is still running
            # ... and the server then refuses the call: this worker is no longer joined.
            stub.Heartbeat(ps_pb2.HeartbeatRequest(worker_id=joined), timeout=5)

        with pytest.raises(grpc.RpcError) as refused:
            client._call(0, in_flight)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert calls == [joined]  # neither retried nor joined again
    assert shard.workers == {}


def test_a_server_listed_twice_is_refused_before_any_join() -> None:
    layout = Layout.from_named_shapes([("w", (4,)), ("b", (2,))], 2)
    # Nothing listens there: the refusal must come before any connection is tried.
    with pytest.raises(ValueError, match=r"127\.0\.0\.1:9 listed more than once; give each shard.s address once"):
        PSClient(["127.0.0.1:9", "127.0.0.1:9"], layout, name="twice")


class _NoAnswer(grpc.RpcError):
    """A call that got no answer (the client reconnects and sends it again)."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "connection lost"

    def trailing_metadata(self) -> tuple[()]:
        return ()


def test_int8_pushes_are_applied_as_decoded_and_a_retry_resends_the_same_bytes(
    served: tuple[Shard, RunningServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, running = served
    address = f"127.0.0.1:{running.port}"
    with PSClient([address], LAYOUT, name="int8", config=ClientConfig(push_dtype="int8", pull_dtype="bf16")) as client:
        assert (client.push_encoder.dtype, client.wire_dtype) == (codec.INT8_BLOCK, codec.BFLOAT16)
        client.init(torch.zeros(4))
        sent: list[list[bytes]] = []
        send = client._send_push

        def flaky(session: ShardSession, header: object, chunks: Iterable[codec.ChunkPayload], *rest: object) -> object:
            sent.append([bytes(c.data) + bytes(c.scales) for c in chunks])
            if len(sent) == 1:
                raise _NoAnswer()
            return send(session, header, chunks, *rest)  # type: ignore[arg-type]

        monkeypatch.setattr(client, "_send_push", flaky)
        monkeypatch.setattr(time, "sleep", lambda seconds: None)
        gradient = torch.tensor([1.0, 0.003, -0.5, 0.0])
        (result,) = client.push(gradient)
        assert result.clock == 1 and len(sent) == 2 and sent[0] == sent[1]
        residual = client.push_encoder.residual(0)
        assert residual is not None
        out = torch.empty(4)
        client.pull(out)
        # The shard applied x̂ = p − e once (asgd, lr 0.1); the pull came back in bf16.
        expected = (-0.1 * (gradient - residual)).to(torch.bfloat16).float()
        torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)
        # Joining the shard again (as after an eviction) starts the residual again at 0.
        client._rejoin(0, client.sessions[0])
        assert client.push_encoder.residual(0) is None


@pytest.mark.parametrize(
    ("dtypes", "match"),
    [
        ({"pull_dtype": "int8"}, "int8 .the 8-bit block codec. is for pushes only"),
        ({"wire_dtype": "int8"}, "never sent below 16 bits"),
        ({"push_dtype": "int4"}, "push dtype 'int4' is not one of"),
    ],
)
def test_int8_pulls_are_refused_before_any_join(dtypes: dict[str, str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PSClient(["127.0.0.1:9"], LAYOUT, name="int8-pulls", config=ClientConfig(**dtypes))  # type: ignore[arg-type]
