"""Bounds on the free-form values a worker sends and the shard keeps or reports.

Names, devices and statistics are stored per worker and returned in every Status reply; left
unbounded, one client could make Status larger than any client accepts (gRPC's 4 MiB default)
or grow the server's memory without end. Each check returns what is wrong, or None.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

MAX_NAME_CHARS = 256  # worker_name
MAX_DEVICE_CHARS = 256  # device
MAX_ENTRIES = 64  # Heartbeat stats, push metadata
MAX_KEY_CHARS = 128  # a stats or metadata key


def text_problem(value: str, what: str, limit: int) -> str | None:
    if len(value) > limit:
        return f"{what} has {len(value)} characters, more than the {limit} allowed; shorten it"
    return None


def numbers_problem(values: Mapping[str, float], what: str) -> str | None:
    """``values`` (stats, metadata) must be few, with short keys."""
    if len(values) > MAX_ENTRIES:
        return f"{what} has {len(values)} entries, more than the {MAX_ENTRIES} allowed"
    for key in values:
        if len(key) > MAX_KEY_CHARS:
            return f"{what} key {key[:32]!r}... has {len(key)} characters, more than the {MAX_KEY_CHARS} allowed"
    return None


def non_finite_problem(values: Mapping[str, float], what: str) -> str | None:
    """A NaN or Inf among ``values``.

    Push metadata is reported with the push and may steer a rule, so it must be finite (a NaN
    there usually comes from NaN in the update itself); Heartbeat stats are not checked: a
    diverging worker's loss may be NaN, and refusing its heartbeat would evict it."""
    for key, value in values.items():
        if not math.isfinite(value):
            return f"{what}[{key!r}] is {value}; send finite numbers"
    return None
