"""The update-rule interface every rule implements, and the registry that names them.

A rule owns its state as flat tensors the length of the shard and mutates the shard's
parameters in place in ``apply``. It knows nothing of the network: the shard hands it the
decoded update and a ``PushContext`` and gets telemetry back.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

import torch

from psserver.core.rules.options import RuleOptionError, RuleOptions


class PayloadKind(enum.IntEnum):
    """What a push carries; values match psproto.v1.PayloadKind."""

    GRADIENT = 1
    DELTA = 2


Telemetry = dict[str, float]


@dataclass(frozen=True)
class PushContext:
    """Everything a rule may need about the push it applies."""

    worker_id: int
    staleness: int
    kind: PayloadKind
    segments: tuple[tuple[int, int], ...]
    metadata: Mapping[str, float] = field(default_factory=dict)
    # The exact parameters the worker pulled; only kept for rules that declare needs_snapshot.
    snapshot: Callable[[], torch.Tensor | None] = lambda: None
    # The shard's clock t before this push is applied (updates applied so far; restored from checkpoints).
    clock: int = 0


OptionsT = TypeVar("OptionsT", bound=RuleOptions)


class UpdateRule(ABC, Generic[OptionsT]):
    """A staleness-aware update rule applied by the server to every push."""

    name: ClassVar[str]
    summary: ClassVar[str]
    options_type: ClassVar[type[RuleOptions]]
    accepted_kinds: ClassVar[frozenset[PayloadKind]] = frozenset({PayloadKind.GRADIENT})
    worker_procedure: ClassVar[str] = "gradient"
    needs_snapshot: ClassVar[bool] = False
    # ``apply`` reads and writes only the elements of ``params`` and ``update`` it is given, keeps no
    # state and returns telemetry that depends on ``ctx`` alone: applied to each span of the shard
    # in turn it gives what it gives applied to the whole, so the server may update the parameters
    # span by span as it sends them (``psserver.core.span_apply``, ``--apply-during-reply``).
    spannable: ClassVar[bool] = False

    def __init__(self, options: OptionsT, length: int) -> None:
        self.options = options
        self.length = length

    @abstractmethod
    def apply(self, params: torch.Tensor, update: torch.Tensor, ctx: PushContext) -> Telemetry:
        """Mutate ``params`` in place with one push; ``update`` is scratch the rule may overwrite."""

    def on_pull(self, worker_id: int) -> None:
        """Called under the shard lock when a worker pulls (e.g. to record the tag it pulled at)."""

    def on_leave(self, worker_id: int) -> None:
        """Called under the shard lock when a worker leaves or is evicted; free its state."""

    def procedure_options(self) -> dict[str, str]:
        """Options the worker procedure needs (sent in the Join reply)."""
        return {}

    @property
    def pull_grace_seconds(self) -> float:
        """How long a worker's next pull may wait for pushes landing with its own (``psserver.core.pull_hold``)."""
        return 0.0

    @property
    def reserves_pulls(self) -> bool:
        """Whether its workers pull with ``reserve`` (no other commit until their push); others may not."""
        return False

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """The rule's state, for checkpoints and tests."""
        return {}

    def load_state_tensors(self, saved: Mapping[str, torch.Tensor]) -> None:
        """Restore what ``state_tensors`` returned; ``ValueError`` (nothing changed) when it does not fit.

        Rules whose state changes shape with the workers (OrMo's tags) override this."""
        copy_state(self.state_tensors(), saved)


def copy_state(current: Mapping[str, torch.Tensor], saved: Mapping[str, torch.Tensor]) -> None:
    """Copy each saved tensor into the live one of the same name, after checking every shape."""
    for name, tensor in current.items():
        value = saved.get(name)
        if value is None or value.shape != tensor.shape:
            raise ValueError(f"no {name!r} of shape {tuple(tensor.shape)}")
    for name, tensor in current.items():
        tensor.copy_(saved[name])


RULES: dict[str, type[UpdateRule[Any]]] = {}

RuleT = TypeVar("RuleT", bound=type[UpdateRule[Any]])


def register(rule: RuleT) -> RuleT:
    """Class decorator: make a rule selectable by its ``name``."""
    if rule.name in RULES:
        raise ValueError(f"rule {rule.name!r} registered twice")
    RULES[rule.name] = rule
    return rule


@dataclass(frozen=True)
class RuleSpec:
    """A rule chosen by name with validated options; builds the rule once the shard length is known."""

    rule: type[UpdateRule[RuleOptions]]
    options: RuleOptions

    @classmethod
    def parse(cls, name: str, raw_options: Mapping[str, str]) -> RuleSpec:
        rule = rule_class(name)
        return cls(rule, rule.options_type.parse(raw_options))

    def build(self, length: int) -> UpdateRule[RuleOptions]:
        return self.rule(self.options, length)


def rule_class(name: str) -> type[UpdateRule[RuleOptions]]:
    try:
        return RULES[name]
    except KeyError:
        raise RuleOptionError(f"unknown rule {name!r}; available rules: {', '.join(sorted(RULES))}") from None
