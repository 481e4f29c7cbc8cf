"""Command-line options of the ``psworker`` commands: the TLS files and token of the commands that
call a server, the wire dtypes of the commands that run workers, and the flags given
on the command line as a configuration table to put over a ``--config`` file."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from pscli.config_file import merged
from psproto import dtypes
from psproto.security import ClientTls, SecurityConfigError, client_security


def path_option(flag: str, help_text: str) -> Callable[[Any], Any]:
    """An option naming an existing, readable file (``None`` when not given)."""
    return click.option(
        flag, type=click.Path(exists=True, dir_okay=False, readable=True, path_type=Path), default=None, help=help_text
    )


tls_ca_option = path_option("--tls-ca", "CA certificate that signed the server's certificate (turns TLS on)")
auth_token_option = path_option("--auth-token-file", "file holding the server's bearer token")


def config_option(
    help_text: str = "TOML file of every setting (docs/configuration.md); a flag given here overrides the file",
) -> Callable[[Any], Any]:
    """``--config FILE``: the command's configuration file (``config_file``; ``None`` when not given)."""
    return click.option(
        "--config",
        "config_file",
        type=click.Path(exists=True, dir_okay=False, readable=True, path_type=Path),
        default=None,
        help=help_text,
    )


def client_security_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--tls-ca, --tls-cert, --tls-key, --auth-token-file for commands that call a server."""
    for option in reversed(
        (
            tls_ca_option,
            path_option("--tls-cert", "this client's certificate, for a server that requires mutual TLS"),
            path_option("--tls-key", "the private key of --tls-cert"),
            auth_token_option,
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


def _pull_dtype(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and value not in dtypes.WIRE_DTYPE_NAMES:
        raise click.BadParameter(dtypes.pull_dtype_problem(value))
    return value


def wire_dtype_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--wire-dtype (pushes and pulls) and --push-dtype; the pull dtype, chunk size and error
    feedback are the configuration file's (``[train.client]``).

    ``int8`` (the 8-bit block codec) is a push dtype only; asked for pulls through --wire-dtype it
    is a usage error saying so."""
    names = click.Choice(sorted(dtypes.PUSH_DTYPE_NAMES))
    wire = click.option(
        "--wire-dtype",
        default="fp32",
        show_default=True,
        type=names,
        callback=_pull_dtype,
        help="what pushes and pulls travel in, unless --push-dtype says otherwise",
    )
    push = click.option(
        "--push-dtype", default=None, type=names, help="what pushes travel in; int8 is the 8-bit block codec"
    )
    return wire(push(command))


def flag_table(ctx: click.Context, flags: Mapping[str, Any], keys: Mapping[str, tuple[str, ...]]) -> dict[str, Any]:
    """The configuration table of the flags given on the command line (not left at their default),
    each at its key path in ``keys`` (``"tls_ca": ("train", "client", "tls", "ca")``); paths as strings."""
    table: dict[str, Any] = {}
    for name, path in keys.items():
        if name not in flags or ctx.get_parameter_source(name) in (None, ParameterSource.DEFAULT):
            continue
        value = flags[name]
        value = str(value) if isinstance(value, Path) else list(value) if isinstance(value, tuple) else value
        for key in reversed(path):
            value = {key: value}
        table = merged(table, value)
    return table
