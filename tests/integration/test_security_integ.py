"""TLS, mutual TLS and the bearer token: every wrong credential is refused and changes nothing."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from psproto.errors import Reason, reason_of
from psproto.layout import Layout
from psproto.security import ClientTls
from psproto.v1 import ps_pb2, ps_pb2_grpc
from pstools.launcher import start_server
from pstools.warm_start import stop_process
from psworker.client import NO_RETRY, ClientConfig, PSClient
from tests.pki import TOKEN, Pki

pytestmark = pytest.mark.integration
LAYOUT = Layout.from_named_shapes([("w", (8,))])


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Pki]]:
    root = tmp_path_factory.mktemp("security")
    pki = Pki(root / "pki")
    process, address = start_server(root, "asgd", 0.1, (), extra_args=pki.server_flags())
    yield address, pki
    assert stop_process(process) == 0


def _join(channel: grpc.Channel, metadata: tuple[tuple[str, str], ...]) -> ps_pb2.JoinResponse:
    request = ps_pb2.JoinRequest(worker_name="w", layout=LAYOUT.to_proto(), layout_hash=LAYOUT.hash)
    reply: ps_pb2.JoinResponse = ps_pb2_grpc.ParameterServerStub(channel).Join(request, timeout=10, metadata=metadata)
    return reply


def test_wrong_credentials_are_refused_and_change_nothing(secured: tuple[str, Pki]) -> None:
    address, pki = secured
    before = pki.status(address)
    good = (("authorization", f"Bearer {TOKEN}"),)
    refusals: list[tuple[str, grpc.StatusCode, Reason | None]] = []
    cases: list[tuple[str, grpc.Channel, tuple[tuple[str, str], ...]]] = [
        ("no token", pki.channel(address, pair=pki.client), ()),
        ("wrong token", pki.channel(address, pair=pki.client), (("authorization", "Bearer guess"),)),
        ("not a bearer token", pki.channel(address, pair=pki.client), (("authorization", TOKEN),)),
        ("plaintext", grpc.insecure_channel(address), good),
        ("no client certificate", pki.channel(address), good),
        ("client certificate of another CA", pki.channel(address, pair=pki.other), good),
        ("server not trusted (other CA)", pki.channel(address, ca=pki.ca2, pair=pki.client), good),
    ]
    for label, channel, metadata in cases:
        with channel, pytest.raises(grpc.RpcError) as refused:
            _join(channel, metadata)
        refusals.append((label, refused.value.code(), reason_of(refused.value)))
    unauthenticated = (grpc.StatusCode.UNAUTHENTICATED, Reason.UNAUTHENTICATED)
    assert refusals[:3] == [(label, *unauthenticated) for label, _, _ in cases[:3]]
    # Handshake failures: the connection never carries an RPC, so no server gave a reason.
    assert all(code == grpc.StatusCode.UNAVAILABLE and reason is None for _, code, reason in refusals[3:]), refusals
    after = pki.status(address)
    assert (after.clock, len(after.workers), after.initialized) == (before.clock, 0, before.initialized)
    assert after.rejected["unauthenticated"] - before.rejected["unauthenticated"] == 3


def test_the_right_credentials_train_and_health_needs_no_token(secured: tuple[str, Pki]) -> None:
    address, pki = secured
    with pki.channel(address, pair=pki.client) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    tls = ClientTls(pki.ca1, *pki.client)
    with PSClient(
        address, LAYOUT, name="trusted", config=ClientConfig(tls=tls, auth_token=TOKEN, retry=NO_RETRY)
    ) as client:
        client.init(torch.zeros(8))
        client.push(torch.ones(8))
        out = torch.empty(8)
        client.pull(out)
        assert torch.allclose(out, torch.full((8,), -0.1))
    with pki.channel(address, pair=pki.client) as channel, pytest.raises(grpc.RpcError) as refused:
        ps_pb2_grpc.ParameterServerStub(channel).Checkpoint(
            ps_pb2.CheckpointRequest(), timeout=10, metadata=(("authorization", f"Bearer {TOKEN}"),)
        )
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "--checkpoint-dir" in (refused.value.details() or "")
