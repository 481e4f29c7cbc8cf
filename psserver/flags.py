"""Parsers for ``psserver serve``'s text flags: each turns a flag's text into a typed value or
raises ``click.BadParameter`` naming the flag and what is valid.

``parse_rule`` is shared with the worker's commands (``psworker simulate``, ``local``), which
take the same ``--rule``/``--lr``/``--rule-opt`` flags.
"""

from __future__ import annotations

import re

import click

from pscli.config_file import parse_byte_size
from psserver.core.rules import RULES, RuleOptionError, RuleSpec
from psserver.rpc.server import MAX_RECEIVE_WINDOW_BYTES, MIN_RECEIVE_WINDOW_BYTES


def parse_rule_options(pairs: tuple[str, ...]) -> dict[str, str]:
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not key=value", param_hint="--rule-opt")
        options[key.strip()] = value.strip()
    return options


def parse_rule(name: str, lr: float | None, pairs: tuple[str, ...]) -> RuleSpec:
    """Validated rule choice from CLI flags; errors name what is valid."""
    raw = parse_rule_options(pairs)
    if lr is not None:
        raw["lr"] = repr(lr)
    try:
        return RuleSpec.parse(name, raw)
    except RuleOptionError as error:
        hint = "--rule" if name not in RULES else "--rule-opt"
        raise click.BadParameter(f"{error} (see `psserver rules`)", param_hint=hint) from None


_EVERY = re.compile(r"^\s*(\d+)\s*(s|sec|seconds?|u|updates?)?\s*$")


def parse_checkpoint_every(text: str) -> tuple[int, float]:
    """``500`` (updates), ``30s`` (seconds) or both, comma-separated: (updates, seconds)."""
    updates, seconds = 0, 0.0
    for part in text.split(","):
        match = _EVERY.match(part)
        if not match or int(match.group(1)) == 0:
            raise click.BadParameter(
                f"{text!r}: give a positive number of updates (500), seconds (30s), or both (500,30s)",
                param_hint="--checkpoint-every",
            )
        if (match.group(2) or "u").startswith("s"):
            seconds = float(match.group(1))
        else:
            updates = int(match.group(1))
    return updates, seconds


def parse_receive_window(text: str) -> int | None:
    """``auto`` (None: gRPC probes the link) or a whole number of bytes, KiB, MiB or GiB (``4MiB``)."""
    if text.strip().lower() == "auto":
        return None
    size = parse_byte_size(text)
    if size is None:
        raise click.BadParameter(
            f"{text!r}: give 'auto' or a whole number of bytes, KiB, MiB or GiB (e.g. 4MiB)",
            param_hint="--receive-window",
        )
    if not MIN_RECEIVE_WINDOW_BYTES <= size <= MAX_RECEIVE_WINDOW_BYTES:
        raise click.BadParameter(
            f"{text!r} is {size} bytes; a window is 64KiB ({MIN_RECEIVE_WINDOW_BYTES}) to "
            f"{MAX_RECEIVE_WINDOW_BYTES} bytes (HTTP/2's largest)",
            param_hint="--receive-window",
        )
    return size


METRICS_OFF = "off"


class MetricsPort(click.ParamType):  # type: ignore[type-arg]  # generic only in click's newest stubs
    """``--metrics-port``: a port 0..65535 (0 picks a free one), or ``off`` for no endpoint."""

    name = "PORT|off"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int | str:
        text = str(value).strip().lower()
        if text == METRICS_OFF:
            return METRICS_OFF
        if text.isdigit() and 0 <= int(text) <= 65535:
            return int(text)
        self.fail(f"{value!r} is neither a port (0..65535) nor 'off'", param, ctx)
