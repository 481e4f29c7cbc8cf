"""The shard's slice of the model: its layout, the fp32 parameters, the rule and its state, the clock.

The layout is adopted at the first Join (or from a checkpoint) and never changes; the
parameters are installed once by Init and then changed only by ``apply``, which calls
``before_update`` first (the pull versions reading them are finished then). Not thread-safe on
its own: the shard calls it under its lock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from psproto.layout import Layout, LayoutError
from psserver.core import request_checks as checks
from psserver.core.config import ShardConfig
from psserver.core.errors import ErrorKind, ShardError
from psserver.core.refusals import Refusals
from psserver.core.rules import PayloadKind, PushContext, Telemetry, UpdateRule
from psserver.core.rules.options import RuleOptions
from psserver.core.shard_state import ParameterState, StateError
from psserver.core.snapshots import SnapshotStore
from psserver.core.workers import PushOutcome


class Model:
    def __init__(
        self,
        config: ShardConfig,
        refusals: Refusals,
        snapshots: SnapshotStore,
        before_update: Callable[[torch.Tensor], None],
        applied: Callable[[float, int], None] = lambda seconds, clock: None,
    ) -> None:
        """``before_update(params)`` is called before every change; ``applied(seconds, clock)`` after each apply."""
        self._config = config
        self._applied = applied
        self._refusals = refusals
        self._snapshots = snapshots
        self._before_update = before_update
        self.layout: Layout | None = None
        self.rule: UpdateRule[RuleOptions] | None = None
        self._params = torch.empty(0)
        self.initialized = False
        self.clock = 0
        self.applied_pushes = 0
        self._segments: tuple[tuple[int, int], ...] = ()

    def adopt(self, layout: Layout) -> None:
        """Take ``layout``: zero parameters of this shard's length and a fresh rule; refused when
        the layout cannot be sharded so or needs more parameters than allowed."""
        index = self._config.shard_index
        try:
            shard = layout.shard(index)
            segments = layout.segments(index)
        except LayoutError as error:
            self._refusals.refuse(ErrorKind.LAYOUT_MISMATCH, str(error))
        refusal = checks.parameter_limit_refusal(shard.length, index, self._config.max_parameters)
        if refusal is not None:
            self._refusals.refuse(refusal.kind, refusal.message)
        self.layout = layout
        self._params = torch.zeros(shard.length)
        self._segments = segments
        self.rule = self._config.rule.build(shard.length)

    def adopt_or_check(self, layout: Layout) -> None:
        """At the first Join, ``adopt`` the worker's layout; later, refuse another model than this one."""
        if self.layout is None:
            self.adopt(layout)
        else:
            refusal = checks.held_layout_refusal(self.layout, layout)
            if refusal is not None:
                self._refusals.refuse(refusal.kind, refusal.message)

    @property
    def params(self) -> torch.Tensor:
        return self._params

    @property
    def length(self) -> int:
        return self._params.numel()

    def install(self, values: torch.Tensor) -> bool:
        """Init: take ``values`` (checked) unless the parameters were already initialised."""
        if self.initialized:
            return False
        self.params.copy_(values)
        self.initialized = True
        return True

    def apply(
        self,
        worker_id: int,
        update: torch.Tensor,
        kind: PayloadKind,
        base_clock: int,
        metadata: dict[str, float],
    ) -> tuple[PushOutcome, float]:
        """Apply a checked update with the rule and advance the clock; the outcome and the apply's seconds."""
        assert self.rule is not None
        self._before_update(self._params)
        staleness = self.clock - base_clock
        snapshots = self._snapshots
        ctx = PushContext(
            worker_id=worker_id,
            staleness=staleness,
            kind=kind,
            segments=self._segments,
            metadata=metadata,
            snapshot=lambda: snapshots.get(base_clock),
            clock=self.clock,
        )
        started = time.perf_counter()
        telemetry: Telemetry = self.rule.apply(self._params, update, ctx)
        apply_seconds = time.perf_counter() - started
        self.clock += 1
        self.applied_pushes += 1
        self._applied(apply_seconds, self.clock)
        return PushOutcome(self.clock, staleness, {"staleness": float(staleness), **telemetry}), apply_seconds

    # -- checkpoint form ------------------------------------------------------------------

    def counters(self) -> dict[str, Any]:
        return {"initialized": self.initialized, "clock": self.clock, "applied_pushes": self.applied_pushes}

    def rule_state(self) -> Mapping[str, torch.Tensor]:
        return self.rule.state_tensors() if self.rule else {}

    def load(self, saved: ParameterState | None, counters: Mapping[str, Any]) -> None:
        """Restore a saved model (checked against its layout by ``shard_state``) and its counters."""
        if saved is not None:
            try:
                self.adopt(saved.layout)
            except ShardError as error:
                raise StateError(error.message) from None
            assert self.rule is not None
            try:
                self.rule.load_state_tensors(saved.rule_state)
            except ValueError as error:
                self.layout, self.rule, self._params = None, None, torch.empty(0)
                raise StateError(
                    f"the saved state of rule {self._config.rule.rule.name} does not fit: {error} "
                    "(was it saved with other rule options?)"
                ) from None
            self.params.copy_(saved.params)
        self.initialized = bool(counters["initialized"]) and saved is not None
        self.clock = int(counters["clock"])
        self.applied_pushes = int(counters["applied_pushes"])
