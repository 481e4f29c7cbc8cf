"""A draining server refuses new ParameterServer calls with UNAVAILABLE and reason DRAINING."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest

from psproto.errors import DOMAIN, Reason, error_info, reason_of
from psserver.rpc.server import DrainInterceptor


def _echo(request: bytes, context: grpc.ServicerContext) -> bytes:
    return request


def test_a_call_to_a_draining_server_is_refused_with_reason_draining() -> None:
    gate = DrainInterceptor()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), interceptors=[gate])
    handlers = {"Join": grpc.unary_unary_rpc_method_handler(_echo)}
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("psproto.v1.ParameterServer", handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            join = channel.unary_unary(
                "/psproto.v1.ParameterServer/Join", request_serializer=None, response_deserializer=None
            )
            assert join(b"hello", timeout=10) == b"hello"
            gate.start()
            with pytest.raises(grpc.RpcError) as refused:
                join(b"hello", timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert reason_of(refused.value) is Reason.DRAINING
        info = error_info(refused.value)
        assert info is not None and info.domain == DOMAIN
    finally:
        server.stop(None)
