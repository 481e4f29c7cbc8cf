"""What is wrong with a request's header, as decisions: a ``Refusal`` (kind and message) or None.

Pure functions of the request and the shard's plain state, so every refusal and its message is
tested without a shard; the shard refuses (counts and raises) what they return.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Protocol

from psproto import codec
from psproto.layout import Layout
from psserver.core.errors import ErrorKind
from psserver.core.request_limits import (
    MAX_DEVICE_CHARS,
    MAX_NAME_CHARS,
    non_finite_problem,
    numbers_problem,
    text_problem,
)
from psserver.core.rules import PayloadKind


@dataclass(frozen=True)
class Refusal:
    kind: ErrorKind
    message: str


def dtype_refusal(dtype: int) -> Refusal | None:
    """A pull's wire dtype this server does not know, or one that is for pushes only."""
    try:
        codec.wire_dtype(dtype)
    except codec.CodecError as error:
        kind = ErrorKind.BAD_REQUEST if error.reason == "push_only_dtype" else ErrorKind.UNKNOWN_DTYPE
        return Refusal(kind, str(error))
    return None


def join_refusal(
    name: str, device: str, layout: Layout, layout_hash: str, shard_index: int, num_shards: int
) -> Refusal | None:
    """A Join's own fields: bounded texts, a hash that is the layout's, the same shard count."""
    for problem in (
        text_problem(name, "worker_name", MAX_NAME_CHARS),
        text_problem(device, "device", MAX_DEVICE_CHARS),
    ):
        if problem:
            return Refusal(ErrorKind.BAD_REQUEST, problem)
    if layout_hash and layout_hash != layout.hash:
        return Refusal(
            ErrorKind.LAYOUT_MISMATCH,
            f"layout_hash {layout_hash} does not match the layout sent ({layout.hash}); "
            "compute it as docs/protocol.md describes",
        )
    if layout.num_shards != num_shards:
        return Refusal(
            ErrorKind.LAYOUT_MISMATCH,
            f"the worker expects {layout.num_shards} shard(s) but this server is shard "
            f"{shard_index} of {num_shards}; start the worker with the same shard count",
        )
    return None


def held_layout_refusal(held: Layout, sent: Layout) -> Refusal | None:
    """A Join with another model than the one the shard holds."""
    if sent.hash == held.hash:
        return None
    return Refusal(
        ErrorKind.LAYOUT_MISMATCH,
        f"this server holds a model with layout {held.hash[:12]} ({len(held.specs)} tensors, "
        f"{held.total_length} parameters); the worker sent layout {sent.hash[:12]} ({len(sent.specs)} tensors, "
        f"{sent.total_length} parameters). Use the same model on every worker",
    )


def parameter_limit_refusal(length: int, shard_index: int, max_parameters: int) -> Refusal | None:
    if length <= max_parameters:
        return None
    return Refusal(
        ErrorKind.LIMIT_REACHED,
        f"the layout puts {length} parameters on shard {shard_index}, more than its limit of "
        f"{max_parameters} (shard.max_parameters in the server's --config file); use more shards or raise it",
    )


def init_refusal(observer: bool, held: Layout, layout_hash: str, initialized: bool) -> Refusal | None:
    """An Init header: from a worker, for the layout it joined with."""
    if observer:
        return Refusal(ErrorKind.BAD_REQUEST, "observers cannot Init; join with role ROLE_WORKER")
    if layout_hash == held.hash:
        return None
    if initialized:
        return Refusal(
            ErrorKind.INIT_CONFLICT,
            f"parameters were already initialised with layout {held.hash[:12]}; this Init carries layout "
            f"{layout_hash[:12] or '(none)'}. Pull the existing parameters instead",
        )
    return Refusal(
        ErrorKind.LAYOUT_MISMATCH,
        f"Init carries layout {layout_hash[:12] or '(none)'} but the worker joined with {held.hash[:12]}",
    )


def stats_refusal(stats: Mapping[str, float]) -> Refusal | None:
    """A Heartbeat's statistics: bounded."""
    problem = numbers_problem(stats, "stats")
    return Refusal(ErrorKind.BAD_REQUEST, problem) if problem else None


def metadata_refusal(metadata: Mapping[str, float]) -> Refusal | None:
    """A push's metadata: bounded, and finite numbers."""
    problem = numbers_problem(metadata, "metadata")
    if problem:
        return Refusal(ErrorKind.BAD_REQUEST, problem)
    problem = non_finite_problem(metadata, "metadata")
    if problem:
        return Refusal(ErrorKind.NON_FINITE, f"{problem}; nothing was applied")
    return None


class RuleFacts(Protocol):
    """What a push header is checked against about the shard's rule (an ``UpdateRule`` has it)."""

    @property
    def name(self) -> str: ...

    @property
    def accepted_kinds(self) -> Collection[PayloadKind]: ...

    @property
    def worker_procedure(self) -> str: ...


NOT_INITIALIZED = Refusal(ErrorKind.NOT_INITIALIZED, "the parameters are not initialised yet; send Init first")


def push_refusal(
    observer: bool,
    layout_hash: str,
    held: Layout,
    initialized: bool,
    kind: int,
    rule: RuleFacts,
    base_clock: int,
    clock: int,
) -> Refusal | None:
    """A push header from a joined worker (checked in the order a client fixes them)."""
    return (
        _sender_refusal(observer, layout_hash, held, initialized)
        or _kind_refusal(kind, rule)
        or _clock_refusal(base_clock, clock)
    )


def _sender_refusal(observer: bool, layout_hash: str, held: Layout, initialized: bool) -> Refusal | None:
    """Whether this worker may push to these parameters now at all."""
    if observer:
        return Refusal(ErrorKind.BAD_REQUEST, "observers cannot push; join with role ROLE_WORKER")
    if layout_hash != held.hash:
        return Refusal(
            ErrorKind.LAYOUT_MISMATCH,
            f"push carries layout {layout_hash[:12] or '(none)'} but this shard holds {held.hash[:12]}; "
            "set layout_hash to the one used at Join",
        )
    return None if initialized else NOT_INITIALIZED


def _kind_refusal(kind: int, rule: RuleFacts) -> Refusal | None:
    """A payload kind unknown, or one the shard's rule does not take."""
    try:
        payload = PayloadKind(kind)
    except ValueError:
        return Refusal(ErrorKind.BAD_REQUEST, f"push kind {kind} is unknown; use GRADIENT or DELTA")
    if payload not in rule.accepted_kinds:
        accepted = ", ".join(k.name for k in sorted(rule.accepted_kinds))
        return Refusal(
            ErrorKind.BAD_REQUEST,
            f"rule {rule.name} does not take {payload.name} pushes; it takes {accepted} "
            f"(worker procedure {rule.worker_procedure!r})",
        )
    return None


def _clock_refusal(base_clock: int, clock: int) -> Refusal | None:
    """An update computed on parameters the shard has not reached yet."""
    if base_clock > clock:
        return Refusal(
            ErrorKind.FUTURE_CLOCK,
            f"base_clock {base_clock} is ahead of the shard's clock {clock}; "
            "send the clock of the parameters the update was computed on",
        )
    return None
