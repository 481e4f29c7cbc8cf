"""ParameterServerOptimizer against a shard that requires mutual TLS and a bearer token (in process)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch
from torch import nn

from psproto.security import ClientTls
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psserver.rpc.security import AuthInterceptor, ServerTls
from psserver.rpc.server import start_server
from psworker.optim import ParameterServerOptimizer
from tests.integration.test_security_integ import TOKEN, Pki


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.zeros(4))


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[tuple[str, Pki, Shard]]:
    pki = Pki(tmp_path / "pki")
    shard = Shard(ShardConfig(RuleSpec.parse("asgd", {"lr": "0.5"})))
    running = start_server(
        shard,
        "127.0.0.1:0",
        interceptors=[AuthInterceptor(TOKEN)],
        tls=ServerTls(pki.server[0], pki.server[1], client_ca=pki.ca1),
    )
    try:
        yield f"127.0.0.1:{running.port}", pki, shard
    finally:
        running.stop(0)


def test_the_optimizer_passes_tls_and_the_token_to_its_client(secured: tuple[str, Pki, Shard]) -> None:
    address, pki, shard = secured
    model = Tiny()
    tls = ClientTls(pki.ca1, *pki.client)
    with ParameterServerOptimizer(model, address, name="secure", tls=tls, auth_token=TOKEN) as opt:
        opt.zero_grad()
        model.w.sum().backward()  # type: ignore[no-untyped-call]
        opt.step()
        assert opt.client.clock == 1
    assert shard.clock == 1
    torch.testing.assert_close(shard.params, torch.full((4,), -0.5))
    torch.testing.assert_close(model.w.detach(), torch.full((4,), -0.5))


def test_without_the_token_the_optimizer_is_refused(secured: tuple[str, Pki, Shard]) -> None:
    address, pki, shard = secured
    with pytest.raises(grpc.RpcError) as refused:
        ParameterServerOptimizer(Tiny(), address, tls=ClientTls(pki.ca1, *pki.client))
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert not shard.workers
