"""A draining server refuses new ParameterServer calls with UNAVAILABLE and reason DRAINING."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from psproto.errors import DOMAIN, Reason, error_info, reason_of
from psserver.rpc.server import DrainInterceptor


async def _echo(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
    return request


def _calls(port: int, gate: DrainInterceptor) -> grpc.RpcError:
    """One call answered, then the gate starts draining: the next call's error."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        join = channel.unary_unary(
            "/psproto.v1.ParameterServer/Join", request_serializer=None, response_deserializer=None
        )
        assert join(b"hello", timeout=10) == b"hello"
        gate.start()
        with pytest.raises(grpc.RpcError) as refused:
            join(b"hello", timeout=10)
    return refused.value


def test_a_call_to_a_draining_server_is_refused_with_reason_draining() -> None:
    async def serve_and_call() -> grpc.RpcError:
        gate = DrainInterceptor()
        server = grpc.aio.server(interceptors=[gate])
        handlers = {"Join": grpc.unary_unary_rpc_method_handler(_echo)}
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("psproto.v1.ParameterServer", handlers)])
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            return await asyncio.to_thread(_calls, port, gate)
        finally:
            await server.stop(None)

    refused = asyncio.run(serve_and_call())
    assert refused.code() == grpc.StatusCode.UNAVAILABLE
    assert reason_of(refused) is Reason.DRAINING
    info = error_info(refused)
    assert info is not None and info.domain == DOMAIN
