"""Client-side security shared by the server's tools and the worker: TLS files, the bearer token.

A client turns on TLS with the CA that signed the server (``ClientTls``; with its own
certificate and key for mutual TLS) and authenticates with ``authorization: Bearer <token>``
metadata on every RPC (``bearer_metadata``). The server's side (its certificate, the
interceptor that checks the token) lives in ``psserver.rpc.security`` and builds on this.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

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


def read_pem(path: Path, flag: str, marker: str = "CERTIFICATE") -> bytes:
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
class ClientTls:
    """What a client needs for TLS: the CA that signed the server (None: the system's roots), and for
    mTLS its own certificate and key."""

    ca: Path | None
    cert: Path | None = None
    key: Path | None = None

    def credentials(self) -> grpc.ChannelCredentials:
        if (self.cert is None) != (self.key is None):
            raise SecurityConfigError("--tls-cert and --tls-key go together: give both for mutual TLS, or neither")
        return grpc.ssl_channel_credentials(
            root_certificates=read_pem(self.ca, "--tls-ca") if self.ca else None,
            private_key=read_pem(self.key, "--tls-key", "PRIVATE KEY") if self.key else None,
            certificate_chain=read_pem(self.cert, "--tls-cert") if self.cert else None,
        )


def bearer_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata that carries ``token`` (none without a token)."""
    return ((AUTH_METADATA_KEY, f"Bearer {token}"),) if token else ()


def client_security(
    tls_ca: Path | None, tls_cert: Path | None, tls_key: Path | None, auth_token_file: Path | None
) -> tuple[ClientTls | None, str | None]:
    """Validated TLS files and token from a client's flags (``--tls-ca``, ``--tls-cert``, ``--tls-key``,
    ``--auth-token-file``); ``SecurityConfigError`` says what to fix. The files are read now, so a
    bad one fails before any connection is made."""
    if tls_ca is None and (tls_cert is not None or tls_key is not None):
        raise SecurityConfigError("--tls-cert/--tls-key need --tls-ca (the CA that signed the server)")
    tls = ClientTls(tls_ca, tls_cert, tls_key) if tls_ca is not None else None
    if tls is not None:
        tls.credentials()
    token = read_token_file(auth_token_file) if auth_token_file is not None else None
    return tls, token


def open_channel(address: str, tls: ClientTls | None, options: list[tuple[str, int]] | None = None) -> grpc.Channel:
    """A channel to ``address``: TLS with ``tls``, plaintext without."""
    if tls is None:
        return grpc.insecure_channel(address, options=options)
    return grpc.secure_channel(address, tls.credentials(), options=options)
