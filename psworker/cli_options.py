"""Command-line options of the ``psworker`` commands: the TLS files and token of the commands that
call a server, and the wire dtype options of the commands that run workers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from psproto import dtypes
from psproto.dtypes import parse_byte_size
from psproto.security import ClientTls, SecurityConfigError, client_security


def path_option(flag: str, help_text: str) -> Callable[[Any], Any]:
    """An option naming an existing, readable file (``None`` when not given)."""
    return click.option(
        flag, type=click.Path(exists=True, dir_okay=False, readable=True, path_type=Path), default=None, help=help_text
    )


def client_security_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--tls-ca, --tls-cert, --tls-key, --auth-token-file for commands that call a server."""
    for option in reversed(
        (
            path_option("--tls-ca", "CA certificate that signed the server's certificate (turns TLS on)"),
            path_option("--tls-cert", "this client's certificate, for a server that requires mutual TLS"),
            path_option("--tls-key", "the private key of --tls-cert"),
            path_option("--auth-token-file", "file holding the server's bearer token"),
        )
    ):
        command = option(command)
    return command


def client_security_from_flags(
    tls_ca: Path | None, tls_cert: Path | None, tls_key: Path | None, auth_token_file: Path | None
) -> tuple[ClientTls | None, str | None]:
    """Validated TLS files and token from the options above; a usage error (exit 2) says what to fix."""
    try:
        return client_security(tls_ca, tls_cert, tls_key, auth_token_file)
    except SecurityConfigError as error:
        raise click.UsageError(str(error)) from None


def parse_chunk_size(text: str, max_message_bytes: int | None = None, param_hint: str = "--chunk-size") -> int:
    """``--chunk-size``: bytes, KiB or MiB, within ``dtypes.chunk_bytes_problem``'s bounds (a usage error otherwise)."""
    size = parse_byte_size(text)
    if size is None:
        raise click.BadParameter(
            f"{text!r}: give a whole number of bytes, KiB or MiB (e.g. 1MiB)", param_hint=param_hint
        )
    problem = dtypes.chunk_bytes_problem(size, max_message_bytes)
    if problem is not None:
        raise click.BadParameter(problem, param_hint=param_hint)
    return size


def _chunk_size(ctx: click.Context, param: click.Parameter, value: str) -> int:
    return parse_chunk_size(value, dtypes.DEFAULT_MAX_MESSAGE_BYTES)


CHUNK_SIZE_HELP = (
    "largest payload of one message (bytes, or 512KiB, 1MiB...): what a step's tensors are cut into; "
    "at least 64KiB, at most half of the largest message"
)


def _pull_dtype(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and value not in dtypes.WIRE_DTYPE_NAMES:
        raise click.BadParameter(dtypes.pull_dtype_problem(value))
    return value


def wire_dtype_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--wire-dtype (pushes and pulls), --push-dtype, --pull-dtype, --chunk-size (what pushes are cut
    into), --error-feedback/--no-error-feedback.

    ``int8`` (the 8-bit block codec) is a push dtype only; asked for pulls (through --wire-dtype
    or --pull-dtype) it is a usage error saying so."""
    names = click.Choice(sorted(dtypes.PUSH_DTYPE_NAMES))
    for option in reversed(
        (
            click.option(
                "--wire-dtype",
                default="fp32",
                show_default=True,
                type=names,
                callback=_pull_dtype,
                help="what pushes and pulls travel in, unless --push-dtype or --pull-dtype says otherwise",
            ),
            click.option(
                "--push-dtype",
                default=None,
                type=names,
                help="what pushes travel in (default: --wire-dtype); int8 is the 8-bit block codec",
            ),
            click.option(
                "--pull-dtype",
                default=None,
                type=names,
                callback=_pull_dtype,
                help="what pulled parameters travel in (default: --wire-dtype); never int8",
            ),
            click.option(
                "--chunk-size",
                default=f"{dtypes.DEFAULT_CHUNK_BYTES // 1024**2}MiB",
                show_default=True,
                callback=_chunk_size,
                help=f"pushes and Init: the {CHUNK_SIZE_HELP}",
            ),
            click.option(
                "--error-feedback/--no-error-feedback",
                default=True,
                show_default=True,
                help="with --push-dtype int8, carry each push's quantisation error into the next push",
            ),
        )
    ):
        command = option(command)
    return command
