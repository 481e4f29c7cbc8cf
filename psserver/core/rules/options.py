"""Typed, validated rule hyperparameters built from ``key=value`` strings.

Each rule declares a frozen dataclass of options; every field is declared with
``option(...)`` so it carries its help text and valid range. Parsing checks names,
types and ranges and reports everything a user can fix in one message.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from psproto.booleans import format_bool, parse_bool
from psserver.core.consistency import ConsistencyModel


class RuleOptionError(ValueError):
    """A rule option that is unknown, of the wrong type or out of range."""


# Options a family of rules declares, by name prefix: the option the family's rules all have, and
# what to tell a user who gives one to a rule outside the family (``declare_family``).
_FAMILIES: dict[str, tuple[str, str]] = {}


def declare_family(prefix: str, marker: str, explanation: str) -> None:
    """Options named ``prefix...`` belong to rules that have option ``marker``: given to another rule,
    the refusal says ``option NAME EXPLANATION`` rather than list the valid options."""
    _FAMILIES[prefix] = (marker, explanation)


def option(
    default: Any,
    help: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    choices: Sequence[str] | None = None,
) -> Any:
    """Declare one option; ``low``/``high`` are inclusive unless ``low_open``."""
    return field(
        default=default,
        metadata={"help": help, "low": low, "high": high, "low_open": low_open, "choices": tuple(choices or ())},
    )


@dataclass(frozen=True)
class RuleOptions:
    """Options every rule has."""

    lr: float = option(0.05, "learning rate eta", low=0.0, low_open=True)

    @classmethod
    def describe(cls) -> list[tuple[str, str, str, str]]:
        """(name, type, default, help with range) for every option, for ``psserver rules``."""
        hints = typing.get_type_hints(cls)
        rows = []
        for f in dataclasses.fields(cls):
            meta = f.metadata
            constraint = _constraint_text(meta)
            help_text = meta.get("help", "") + (f" ({constraint})" if constraint else "")
            rows.append((f.name, _type_name(hints[f.name]), _format_value(f.default), help_text))
        return rows

    @classmethod
    def parse(cls, raw: Mapping[str, str]) -> RuleOptions:
        """Build options from strings; unknown names, bad types and out-of-range values raise."""
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - set(fields))
        for name in unknown:
            for prefix, (marker, explanation) in _FAMILIES.items():
                if name.startswith(prefix) and marker not in fields:
                    raise RuleOptionError(f"option {name} {explanation}")
        if unknown:
            raise RuleOptionError(
                f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                f"valid options: {', '.join(fields)}"
            )
        values: dict[str, Any] = {}
        for name, text in raw.items():
            values[name] = _convert(name, text, hints[name], fields[name].metadata)
        return cls(**values)

    def consistency_refusal(self, consistency: ConsistencyModel) -> str | None:
        """Why these options cannot run under ``consistency``, or None: the one check the serve CLI, the
        simulator and the shard make. Options whose scheduling needs asynchronous training override it."""
        return None

    def as_strings(self) -> dict[str, str]:
        return {f.name: _format_value(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _type_name(kind: Any) -> str:
    return getattr(kind, "__name__", str(kind))


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return format_bool(value)
    return str(value)


def _constraint_text(meta: Mapping[str, Any]) -> str:
    if meta.get("choices"):
        return "one of " + ", ".join(meta["choices"])
    low, high = meta.get("low"), meta.get("high")
    if low is not None and high is not None:
        return f"{low} {'<' if meta.get('low_open') else '<='} value <= {high}"
    if low is not None:
        return f"value {'>' if meta.get('low_open') else '>='} {low}"
    if high is not None:
        return f"value <= {high}"
    return ""


def _convert(name: str, text: str, kind: Any, meta: Mapping[str, Any]) -> Any:
    value: Any
    try:
        if kind is bool:
            value = parse_bool(text)
        elif kind is int:
            value = int(text)
        elif kind is float:
            value = float(text)
            if not math.isfinite(value):
                raise ValueError(text)
        else:
            value = str(text)
    except ValueError:
        raise RuleOptionError(f"option {name}={text!r} is not a valid {_type_name(kind)}") from None
    choices = meta.get("choices")
    if choices and value not in choices:
        raise RuleOptionError(f"option {name}={text!r} must be one of {', '.join(choices)}")
    low, high = meta.get("low"), meta.get("high")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        too_low = low is not None and (value <= low if meta.get("low_open") else value < low)
        too_high = high is not None and value > high
        if too_low or too_high:
            raise RuleOptionError(f"option {name}={text} is out of range: {_constraint_text(meta)}")
    return value
