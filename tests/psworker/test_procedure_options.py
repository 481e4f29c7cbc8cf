"""Procedure options: parsed once from what the server sends, with no defaults of the worker's own."""

from __future__ import annotations

import pytest

from psproto.booleans import FALSE_WORDS, TRUE_WORDS, parse_bool
from psproto.v1 import ps_pb2
from psserver.core.rules import RULES, RuleSpec
from psserver.core.rules.options import RuleOptionError
from psworker.procedure_options import (
    AgnOptions,
    DeltaOptions,
    EasgdOptions,
    GemOptions,
    ProcedureError,
    parse_options,
)
from psworker.procedures import PROCEDURES, procedure_class


def _sent(rule: str, **options: str) -> ps_pb2.RuleInfo:
    """The RuleInfo a server running ``rule`` sends in its Join reply."""
    built = RuleSpec.parse(rule, options).build(4)
    return ps_pb2.RuleInfo(
        name=built.name, worker_procedure=built.worker_procedure, procedure_options=built.procedure_options()
    )


@pytest.mark.parametrize("rule", sorted(RULES))
def test_every_rule_sends_what_its_procedure_needs(rule: str) -> None:
    sent = _sent(rule)
    cls = procedure_class(sent)
    assert cls.name in PROCEDURES
    parse_options(cls.name, cls.options_type, sent.procedure_options)  # nothing missing, nothing malformed


def test_gem_options_come_from_the_server_complete() -> None:
    sent = _sent("gem", kappa="2", atomic="off")
    options = parse_options("gem", GemOptions, sent.procedure_options)
    assert options == GemOptions(
        lr=0.05, momentum=0.9, kappa=2.0, pi_max=5.0, epsilon=1e-12, local_apply=True, atomic=False
    )


def test_the_worker_fills_in_no_default() -> None:
    with pytest.raises(ProcedureError, match="procedure gem needs option 'momentum' from the server"):
        parse_options("gem", GemOptions, {"lr": "0.05"})
    with pytest.raises(ProcedureError, match="needs option 'local_momentum'"):
        parse_options("easgd", EasgdOptions, {"lr": "0.1", "rho": "2", "window": "4"})


def test_malformed_and_out_of_range_options_are_named() -> None:
    with pytest.raises(ProcedureError, match=r"option window='many' is not an integer"):
        parse_options("delta", DeltaOptions, {"lr": "0.1", "window": "many"})
    with pytest.raises(ProcedureError, match=r"option atomic='maybe' is not true or false"):
        parse_options("gem", GemOptions, {**_sent("gem").procedure_options, "atomic": "maybe"})
    with pytest.raises(ProcedureError, match="window must be >= 1"):
        parse_options("delta", DeltaOptions, {"lr": "0.1", "window": "0"})
    with pytest.raises(ProcedureError, match="local_optimizer 'rmsprop' is not sgd or adam"):
        parse_options("agn", AgnOptions, {"lr": "0.1", "window": "2", "local_optimizer": "rmsprop"})


def test_options_a_newer_server_adds_are_ignored() -> None:
    assert parse_options("delta", DeltaOptions, {"lr": "0.1", "window": "3", "future": "x"}) == DeltaOptions(0.1, 3)


@pytest.mark.parametrize("word", sorted(TRUE_WORDS | FALSE_WORDS | {"maybe", "", "TRUE ", "Off"}))
def test_server_and_worker_read_booleans_alike(word: str) -> None:
    """The rule's options (server) and the procedure's (worker) go through one parser."""
    try:
        expected: bool | None = parse_bool(word)
    except ValueError:
        expected = None
    try:
        server = RuleSpec.parse("gem", {"atomic": word}).options.atomic  # type: ignore[attr-defined]
    except RuleOptionError:
        server = None
    try:
        sent = {**_sent("gem").procedure_options, "atomic": word}
        worker: bool | None = parse_options("gem", GemOptions, sent).atomic
    except ProcedureError:
        worker = None
    assert server == worker == expected
