"""TLS credentials and the bearer-token interceptor.

Every RPC except the standard health service must carry ``authorization: Bearer <token>``
metadata when the server has a token; others are refused with UNAUTHENTICATED before any
handler runs (nothing is read or changed). Tokens are compared in constant time.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

if TYPE_CHECKING:
    _Handler = grpc.RpcMethodHandler[Any, Any]
    _Interceptor = grpc.ServerInterceptor[Any, Any]
else:
    _Interceptor = grpc.ServerInterceptor

# Health checks stay open: load balancers and kubelets probe without credentials.
UNAUTHENTICATED_PREFIXES = ("/grpc.health.v1.Health/",)
AUTH_METADATA_KEY = "authorization"


class SecurityConfigError(ValueError):
    """A TLS file or token file that cannot be used; the message names the flag and the fix."""


def read_token_file(path: Path, flag: str = "--auth-token-file") -> str:
    """The token in ``path`` (surrounding whitespace removed); refuses a missing or empty file."""
    try:
        token = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as error:
        raise SecurityConfigError(f"{flag}: cannot read {path}: {error}") from None
    if not token:
        raise SecurityConfigError(f"{flag}: {path} is empty; put the shared token in it")
    if any(c.isspace() for c in token) or not token.isprintable():
        raise SecurityConfigError(f"{flag}: the token in {path} must be one line of printable characters, no spaces")
    return token


def _read(path: Path, flag: str, marker: str = "CERTIFICATE") -> bytes:
    """A PEM file's bytes; refuses one without a ``-----BEGIN ... <marker>-----`` block."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise SecurityConfigError(f"{flag}: cannot read {path}: {error}") from None
    blocks = [line for line in data.splitlines() if line.startswith(b"-----BEGIN ")]
    if not any(line.rstrip(b"-").endswith(marker.encode()) for line in blocks):
        kind = "private key" if marker == "PRIVATE KEY" else "certificate"
        raise SecurityConfigError(f"{flag}: {path} is not a PEM {kind} (no '-----BEGIN ... {marker}-----' block)")
    return data


@dataclass(frozen=True)
class ServerTls:
    """The server's certificate chain and key, and the CA its clients' certificates must chain to (mTLS)."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    def credentials(self) -> grpc.ServerCredentials:
        chain = _read(self.cert, "--tls-cert")
        key = _read(self.key, "--tls-key", "PRIVATE KEY")
        client_ca = _read(self.client_ca, "--tls-client-ca") if self.client_ca else None
        try:
            return grpc.ssl_server_credentials(
                [(key, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
            )
        except (ValueError, RuntimeError) as error:
            raise SecurityConfigError(f"--tls-cert/--tls-key: {error}") from None


@dataclass(frozen=True)
class ClientTls:
    """What a client needs for TLS: the CA that signed the server, and for mTLS its own certificate and key."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        if (self.cert is None) != (self.key is None):
            raise SecurityConfigError("--tls-cert and --tls-key go together: give both for mutual TLS, or neither")
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca, "--tls-ca"),
            private_key=_read(self.key, "--tls-key", "PRIVATE KEY") if self.key else None,
            certificate_chain=_read(self.cert, "--tls-cert") if self.cert else None,
        )


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return ((AUTH_METADATA_KEY, f"Bearer {token}"),) if token else ()


class AuthInterceptor(_Interceptor):
    """Refuses every RPC (health excepted) without ``authorization: Bearer <token>``."""

    def __init__(self, token: str, on_refused: Callable[[str], None] | None = None) -> None:
        if not token:
            raise ValueError("the token is empty")
        self._expected = f"Bearer {token}".encode()
        self._on_refused = on_refused

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], _Handler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler | None:
        method = handler_call_details.method
        if method.startswith(UNAUTHENTICATED_PREFIXES):
            return continuation(handler_call_details)
        presented = [value for key, value in handler_call_details.invocation_metadata or () if key == AUTH_METADATA_KEY]
        if len(presented) == 1:
            value = presented[0]
            value_bytes = value if isinstance(value, bytes) else str(value).encode()
            if hmac.compare_digest(value_bytes, self._expected):
                return continuation(handler_call_details)
            reason = "the bearer token is wrong"
        elif presented:
            reason = "more than one authorization header was sent"
        else:
            reason = "no bearer token was sent; send metadata 'authorization: Bearer <token>' (--auth-token-file)"
        if self._on_refused is not None:
            self._on_refused(method)
        handler = continuation(handler_call_details)
        return _refusal(handler, reason)


def _refusal(handler: _Handler | None, reason: str) -> _Handler:
    """A handler of the same shape that reads nothing and answers UNAUTHENTICATED."""

    def refuse(request: Any, context: grpc.ServicerContext) -> Any:
        context.abort(grpc.StatusCode.UNAUTHENTICATED, reason)

    if handler is not None and handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler is not None and handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if handler is not None and handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)
