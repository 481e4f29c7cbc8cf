"""The update-rule interface every rule implements, and the registry that names them.

A rule owns its state as flat tensors the length of the shard and mutates the shard's
parameters in place in ``apply``. It knows nothing of the network: the shard hands it the
decoded update and a ``PushContext`` and gets telemetry back.

A rule also owns its scheduling: what a pull waits for and what taking it changes, what a push
waits for, what follows an applied push (the local steps of the worker's next window, a hold on
its next pull), and whether a worker may pull exclusively. The shard calls these hooks under its
lock with a ``ShardView`` and executes the decisions they return (``Wait``, ``PullTaken``,
``PushDecision``); it knows no rule by name. Per-worker scheduling state lives in the rule. The
defaults do nothing, so most rules write none.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar

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


class Paces(Protocol):
    """Each live worker's pace, measured by the shard from its push timing (``psserver.core.local_steps``)."""

    def speed(self, worker_id: int) -> float | None:
        """The worker's local steps per second, None until measured."""

    def known_speeds(self) -> list[float]:
        """The speeds of every live worker measured so far."""

    def next_push_at(self, worker_id: int, steps: float | None = None) -> float | None:
        """When the worker's current window of ``steps`` (default: as many as its last) should end."""


@dataclass(frozen=True)
class ShardView:
    """What a rule's scheduling hooks may read of the shard (under its lock)."""

    now: Callable[[], float]
    # Ids of the joined workers that push (observers only pull).
    live: Callable[[], Iterable[int]]
    paces: Paces
    # An exclusive pull lapses after this long when its worker never pushes.
    exclusive_pull_seconds: float = 10.0


@dataclass(frozen=True)
class Wait:
    """A request waits until ``ready()`` holds or the shard's clock reaches ``deadline``.

    ``reported``: the wait is a hold on the pull that the shard reports (``pull_held``)."""

    ready: Callable[[], bool]
    deadline: float | None = None
    reported: bool = False


@dataclass(frozen=True)
class PullHold:
    """A worker's next pull waits, at the longest, until ``until_time``; ``released`` once it pulled."""

    until_time: float
    released: bool = False


@dataclass(frozen=True)
class PullTaken:
    """What a pull's going ahead changes on the shard: ``restart_window``, the worker's window of local
    steps begins now, not when its push was applied (the time it waited is no slowness)."""

    restart_window: bool = False


@dataclass(frozen=True)
class PushDecision:
    """What follows an applied push: ``telemetry`` added to its outcome (``local_steps``: the worker's
    next window, which the push reply carries)."""

    telemetry: Mapping[str, float] = field(default_factory=dict)


NOTHING_TO_DO = PushDecision()
# The telemetry key of a worker's next window of local steps (``PushResponse.local_steps``).
LOCAL_STEPS_KEY = "local_steps"

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

    # -- scheduling hooks (called under the shard lock; the defaults do nothing) --

    @property
    def paced_window(self) -> int | None:
        """The local steps a push counts when its client does not say (``steps_done``), if the rule needs
        the shard to measure its workers' paces; None (the default): no measurement."""
        return None

    def exclusive_pull_refusal(self) -> str | None:
        """Why a worker may not pull exclusively (no other worker's push applied until its own), or None."""
        return f"rule {self.name} with these options takes no exclusive pulls; pull without one"

    def pull_wait(self, worker_id: int, exclusive: bool, view: ShardView) -> Wait | None:
        """What ``worker_id``'s pull waits for before it is answered; None: nothing."""
        return None

    def pull_taken(self, worker_id: int, exclusive: bool, view: ShardView) -> PullTaken:
        """``worker_id``'s pull goes ahead (its wait is over)."""
        return PullTaken()

    def pull_hold(self, worker_id: int, view: ShardView) -> PullHold | None:
        """The hold on ``worker_id``'s next pull while it still holds (None: it would pull at once)."""
        return None

    def pull_hold_pending(self, worker_id: int) -> bool:
        """Whether ``worker_id``'s last push put a hold on its next pull that it has not pulled past."""
        return False

    def push_wait(self, worker_id: int, view: ShardView) -> Wait | None:
        """What ``worker_id``'s push waits for before it is applied; None: nothing."""
        return None

    def push_taken(self, worker_id: int) -> None:
        """``worker_id``'s push goes ahead (applied now, or added to a BSP round)."""

    def push_has_priority(self, worker_id: int, now: float) -> bool:
        """Whether ``worker_id``'s pushes never queue for a receive buffer (others wait on them)."""
        return False

    def after_push(self, worker_id: int, view: ShardView) -> PushDecision:
        """``worker_id``'s push was applied, and its pace measured."""
        return NOTHING_TO_DO

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
