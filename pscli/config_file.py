"""Configuration files (``psserver serve --config``, ``psworker train --config``): TOML tables read
into a frozen dataclass tree, every key and type checked. Generic and click-free, so both sides read
their files with it.

The format: a table per nested
dataclass (``[transport]``, ``[shard.consistency]``), a key per field, sizes in bytes given as a
whole number or as ``"4MiB"`` (any ``*_bytes`` key), paths as strings, an optional table as
``false`` to turn it off (``metrics = false``), an optional value as ``"auto"`` for its automatic
default. An unknown key, a value of the wrong type, and a value out of range are a
``ConfigFileError`` naming the key and what is valid. A field's documentation is the comment
above it (``docstrings``), which the generated docs/configuration.md shows.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import tomllib

T = TypeVar("T")
# Types read by a function of (value, key) rather than field by field (a rule and its options).
Converters = Mapping[type, Callable[[Any, str], Any]]
AUTO = "auto"
_FIELD = re.compile(r"^    (\w+): ")


_SIZE = re.compile(r"^\s*(\d+)\s*(b|kib|mib|gib)?\s*$", re.IGNORECASE | re.ASCII)
_SIZE_UNITS = {"b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3}


def parse_byte_size(text: str) -> int | None:
    """A whole number of bytes, KiB, MiB or GiB (``4MiB``, ``65536``); None when ``text`` is not one."""
    match = _SIZE.match(text)
    if match is None:
        return None
    return int(match.group(1)) * _SIZE_UNITS[(match.group(2) or "b").lower()]


class ConfigFileError(ValueError):
    """A configuration file (or a flag over it) that cannot be used; the message names the key."""


def read_toml(path: Path) -> dict[str, Any]:
    """The tables of the TOML file at ``path``."""
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except OSError as error:
        raise ConfigFileError(f"{path}: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigFileError(f"{path} is not valid TOML: {error}") from None


def merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over``'s keys set on it, tables merged key by key (``over`` wins)."""
    result = dict(base)
    for key, value in over.items():
        below = result.get(key)
        result[key] = merged(below, value) if isinstance(below, dict) and isinstance(value, dict) else value
    return result


def build(cls: type[T], table: Mapping[str, Any], converters: Converters | None = None, where: str = "") -> T:
    """An instance of the dataclass ``cls`` from ``table``; the fields it leaves out keep their defaults."""
    hints = typing.get_type_hints(cls)
    known = {field.name: field for field in dataclasses.fields(cls) if field.init}  # type: ignore[arg-type]
    for key in table:
        if key not in known:
            raise ConfigFileError(f"unknown key {where}{key}; valid keys here: {', '.join(sorted(known))}")
    for name, field in known.items():
        required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        if required and name not in table:
            raise ConfigFileError(f"{where.rstrip('.') or 'the file'} needs the key {where}{name}")
    values = {key: _convert(hints[key], value, f"{where}{key}", converters or {}) for key, value in table.items()}
    try:
        return cls(**values)
    except ConfigFileError:
        raise
    except (TypeError, ValueError) as error:
        raise ConfigFileError(f"{where.rstrip('.') or 'config'}: {error}") from None


def _convert(kind: Any, value: Any, key: str, converters: Converters) -> Any:
    optional = typing.get_origin(kind) in (typing.Union, types.UnionType)
    if optional:
        (kind,) = [arg for arg in typing.get_args(kind) if arg is not type(None)]
        if value == AUTO or (value is False and dataclasses.is_dataclass(kind)):
            return None
    if kind in converters:
        return converters[kind](value, key)
    if dataclasses.is_dataclass(kind):
        if not isinstance(value, dict):
            raise ConfigFileError(f"{key} must be a table{' (or false)' if optional else ''}, not {value!r}")
        return build(typing.cast(type[Any], kind), value, converters, f"{key}.")
    if typing.get_origin(kind) in (tuple, dict):
        return _collection(kind, value, key, converters)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        choices = [member.value for member in kind]
        if value not in choices:
            raise ConfigFileError(f"{key} must be one of {', '.join(map(str, choices))}, not {value!r}")
        return kind(value)
    return _scalar(kind, value, key, optional)


def _collection(kind: Any, value: Any, key: str, converters: Converters) -> Any:
    if typing.get_origin(kind) is dict:
        return _mapping(typing.get_args(kind), value, key)
    return _sequence(typing.get_args(kind), value, key, converters)


def _sequence(items: tuple[Any, ...], value: Any, key: str, converters: Converters) -> tuple[Any, ...]:
    """A list for ``tuple[X, ...]`` (any length) or ``tuple[X, Y]`` (exactly that many items); a
    list of tables (``[[groups]]``) for ``tuple[SomeDataclass, ...]``."""
    any_length = items[-1] is Ellipsis
    if not isinstance(value, list) or not (any_length or len(value) == len(items)):
        size = "" if any_length else f" of {len(items)}"
        raise ConfigFileError(f"{key} must be a list{size}, not {value!r}")
    kinds = items[:1] * len(value) if any_length else items
    if any_length and dataclasses.is_dataclass(items[0]):
        return tuple(_convert(items[0], item, f"{key}[{index}]", converters) for index, item in enumerate(value))
    return tuple(_scalar(kind, item, key, False) for kind, item in zip(kinds, value, strict=True))


def _mapping(kinds: tuple[Any, ...], value: Any, key: str) -> dict[str, Any]:
    """An inline table for ``dict[str, X]`` (``resources = { a100 = 1 }``), each value an X."""
    if not isinstance(value, dict):
        raise ConfigFileError(f"{key} must be a table, not {value!r}")
    return {name: _scalar(kinds[1], item, f"{key}.{name}", False) for name, item in value.items()}


def _scalar(kind: Any, value: Any, key: str, optional: bool) -> Any:
    auto = f' or "{AUTO}"' if optional else ""
    if kind is bool and isinstance(value, bool):
        return value
    if kind is int and key.endswith("_bytes") and isinstance(value, str):
        size = parse_byte_size(value)
        if size is None:
            raise ConfigFileError(f"{key} must be a whole number of bytes, KiB, MiB or GiB (4MiB){auto}, not {value!r}")
        return size
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if kind in (str, Path) and isinstance(value, str):
        return kind(value)
    names = {bool: "true or false", int: "a whole number", float: "a number", str: "a string", Path: "a path"}
    raise ConfigFileError(f"{key} must be {names.get(kind, getattr(kind, '__name__', str(kind)))}{auto}, not {value!r}")


def docstrings(cls: type) -> dict[str, str]:
    """Each field's documentation: the comment lines right above it in the class body."""
    docs: dict[str, str] = {}
    comment: list[str] = []
    for line in inspect.getsource(cls).splitlines():
        text = line.strip()
        if text.startswith("#"):
            comment.append(text.lstrip("#").strip())
            continue
        match = _FIELD.match(line)
        if match is not None and comment:
            docs[match.group(1)] = " ".join(comment)
        comment = []
    return docs


def dump_toml(table: Mapping[str, Any], where: str = "") -> str:
    """``table`` (strings, numbers, booleans, paths and tables of them) as the TOML text ``read_toml`` reads back."""
    lines = [f"{key} = {_toml_value(value)}" for key, value in table.items() if not isinstance(value, Mapping)]
    for key, value in table.items():
        if isinstance(value, Mapping):
            lines += ["", f"[{where}{key}]", dump_toml(value, f"{where}{key}.")]
    return "\n".join(line for line in lines if line or lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{name} = {_toml_value(item)}" for name, item in value.items()) + " }"
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
