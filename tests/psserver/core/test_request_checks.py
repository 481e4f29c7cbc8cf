"""Header checks as decisions: each returns the refusal a client gets, or None."""

from __future__ import annotations

import math
from dataclasses import dataclass

from psproto import codec
from psproto.layout import Layout
from psserver.core.errors import ErrorKind
from psserver.core.request_checks import (
    NOT_INITIALIZED,
    RuleFacts,
    dtype_refusal,
    held_layout_refusal,
    init_refusal,
    join_refusal,
    metadata_refusal,
    parameter_limit_refusal,
    push_refusal,
    stats_refusal,
)
from psserver.core.rules import PayloadKind

LAYOUT = Layout.from_named_shapes([("w", (2, 3))])
OTHER = Layout.from_named_shapes([("w", (3, 3))])


@dataclass(frozen=True)
class Rule:
    """The facts of a rule a push is checked against (a RuleFacts)."""

    name: str
    accepted_kinds: frozenset[PayloadKind]
    worker_procedure: str


GRADIENTS_ONLY: RuleFacts = Rule("asgd", frozenset({PayloadKind.GRADIENT}), "gradient")


def kind_of(refusal: object) -> ErrorKind | None:
    return getattr(refusal, "kind", None)


def test_join_checks_texts_hash_and_shard_count() -> None:
    assert join_refusal("a", "cpu", LAYOUT, LAYOUT.hash, 0, 1) is None
    assert join_refusal("a", "cpu", LAYOUT, "", 0, 1) is None  # the hash is optional
    assert kind_of(join_refusal("a" * 300, "cpu", LAYOUT, "", 0, 1)) is ErrorKind.BAD_REQUEST
    assert kind_of(join_refusal("a", "cpu", LAYOUT, OTHER.hash, 0, 1)) is ErrorKind.LAYOUT_MISMATCH
    refusal = join_refusal("a", "cpu", LAYOUT, "", 1, 2)
    assert refusal is not None and "same shard count" in refusal.message


def test_another_model_than_the_one_held_is_refused() -> None:
    assert held_layout_refusal(LAYOUT, LAYOUT) is None
    refusal = held_layout_refusal(LAYOUT, OTHER)
    assert refusal is not None and refusal.kind is ErrorKind.LAYOUT_MISMATCH and "same model" in refusal.message


def test_the_parameter_limit() -> None:
    assert parameter_limit_refusal(10, 0, 10) is None
    assert kind_of(parameter_limit_refusal(11, 0, 10)) is ErrorKind.LIMIT_REACHED


def test_init_from_an_observer_or_with_another_layout() -> None:
    assert init_refusal(False, LAYOUT, LAYOUT.hash, False) is None
    assert kind_of(init_refusal(True, LAYOUT, LAYOUT.hash, False)) is ErrorKind.BAD_REQUEST
    assert kind_of(init_refusal(False, LAYOUT, OTHER.hash, False)) is ErrorKind.LAYOUT_MISMATCH
    assert kind_of(init_refusal(False, LAYOUT, OTHER.hash, True)) is ErrorKind.INIT_CONFLICT


def test_numbers_and_dtypes() -> None:
    assert stats_refusal({"loss": 1.0}) is None and metadata_refusal({"lr": 0.1}) is None
    assert kind_of(metadata_refusal({"x": math.nan})) is ErrorKind.NON_FINITE
    assert kind_of(stats_refusal({f"k{i}": 0.0 for i in range(100)})) is ErrorKind.BAD_REQUEST
    assert dtype_refusal(codec.BFLOAT16) is None and dtype_refusal(codec.UNSPECIFIED) is None
    assert kind_of(dtype_refusal(99)) is ErrorKind.UNKNOWN_DTYPE
    # A dtype this server decodes for pushes only: the request, not the server, is wrong.
    assert kind_of(dtype_refusal(codec.INT8_BLOCK)) is ErrorKind.BAD_REQUEST


def test_push_headers_are_checked_in_the_order_a_client_fixes_them() -> None:
    def check(**changes: object) -> ErrorKind | None:
        fields: dict[str, object] = {
            "observer": False,
            "layout_hash": LAYOUT.hash,
            "held": LAYOUT,
            "initialized": True,
            "kind": int(PayloadKind.GRADIENT),
            "rule": GRADIENTS_ONLY,
            "base_clock": 3,
            "clock": 3,
        }
        return kind_of(push_refusal(**{**fields, **changes}))  # type: ignore[arg-type]

    assert check() is None
    assert check(observer=True, layout_hash="x") is ErrorKind.BAD_REQUEST
    assert check(layout_hash="x", initialized=False) is ErrorKind.LAYOUT_MISMATCH
    assert check(initialized=False, kind=9) is ErrorKind.NOT_INITIALIZED is NOT_INITIALIZED.kind
    assert check(kind=9) is ErrorKind.BAD_REQUEST
    assert check(kind=int(PayloadKind.DELTA)) is ErrorKind.BAD_REQUEST
    assert check(base_clock=4) is ErrorKind.FUTURE_CLOCK
