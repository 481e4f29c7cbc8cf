"""The server's TLS credentials and the bearer-token interceptor.

Every RPC except the standard health service must carry ``authorization: Bearer <token>``
metadata when the server has a token; others are refused with UNAUTHENTICATED (and reason
UNAUTHENTICATED) before any handler runs (nothing is read or changed). Tokens are compared in constant time.
A method the server does not serve is UNIMPLEMENTED with or without a token (the .proto is public).
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

# The client's side (TLS files, token file, metadata) is shared with the worker through psproto.
from psproto.errors import Reason
from psproto.security import AUTH_METADATA_KEY, ClientTls, SecurityConfigError, read_pem
from psserver.rpc.status_codes import refusal, refuse
from psserver.rpc.wrapped_handlers import AioInterceptor, Handler

# Health checks stay open: load balancers and kubelets probe without credentials.
UNAUTHENTICATED_PREFIXES = ("/grpc.health.v1.Health/",)


@dataclass(frozen=True)
class ServerTls:
    """The server's certificate chain and key, and the CA its clients' certificates must chain to (mTLS)."""

    # PEM certificate chain of this server.
    cert: Path
    # PEM private key of the certificate.
    key: Path
    # Require client certificates signed by this CA (mutual TLS).
    client_ca: Path | None = None

    def credentials(self) -> grpc.ServerCredentials:
        chain = read_pem(self.cert, "--tls-cert")
        key = read_pem(self.key, "--tls-key", "PRIVATE KEY")
        client_ca = read_pem(self.client_ca, "--tls-client-ca") if self.client_ca else None
        try:
            return grpc.ssl_server_credentials(
                [(key, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
            )
        except (ValueError, RuntimeError) as error:
            raise SecurityConfigError(f"--tls-cert/--tls-key: {error}") from None

    def as_client(self) -> ClientTls:
        """What a replica presents when it calls another replica of its shard: its own certificate (so
        mutual TLS holds between replicas too), trusting ``client_ca``, the CA that signs the replicas'
        certificates as well as the workers'; without one, the system's roots."""
        return ClientTls(self.client_ca, self.cert, self.key)


class AuthInterceptor(AioInterceptor):
    """Refuses every RPC (health excepted) without ``authorization: Bearer <token>``."""

    def __init__(self, token: str, on_refused: Callable[[str], None] | None = None) -> None:
        if not token:
            raise ValueError("the token is empty")
        self._expected = f"Bearer {token}".encode()
        self._on_refused = on_refused

    async def intercept_service(  # type: ignore[override]  # the stub forgets None (an unknown method)
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        method = handler_call_details.method
        if method.startswith(UNAUTHENTICATED_PREFIXES):
            return await continuation(handler_call_details)
        presented = [value for key, value in handler_call_details.invocation_metadata or () if key == AUTH_METADATA_KEY]
        if len(presented) == 1:
            value = presented[0]
            value_bytes = value if isinstance(value, bytes) else str(value).encode()
            if hmac.compare_digest(value_bytes, self._expected):
                return await continuation(handler_call_details)
            reason = "the bearer token is wrong"
        elif presented:
            reason = "more than one authorization header was sent"
        else:
            reason = "no bearer token was sent; send metadata 'authorization: Bearer <token>' (--auth-token-file)"
        handler = await continuation(handler_call_details)
        if handler is None:
            # A method the server does not serve is UNIMPLEMENTED with or without a token: nothing
            # runs either way, and an interceptor outside this one (latency) then records nothing,
            # so an unauthenticated caller cannot make metric labels out of invented method names.
            return None
        if self._on_refused is not None:
            self._on_refused(method)
        return _refusal(handler, reason)


def _refusal(handler: Handler, reason: str) -> Handler:
    """A handler of the same shape that reads nothing and answers UNAUTHENTICATED (reason too)."""
    refused = refusal(Reason.UNAUTHENTICATED, reason)

    async def answer(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await refuse(context, refused)

    async def answer_streaming(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        await refuse(context, refused)
        yield  # an async generator, as a streaming reply's behaviour is

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(answer_streaming)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(answer)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(answer_streaming)
    return grpc.unary_unary_rpc_method_handler(answer)
