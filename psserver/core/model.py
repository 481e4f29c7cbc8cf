"""The shard's slice of the model: its layout, the fp32 parameters, the rule and its state, the clock.

The layout is adopted at the first Join (or from a checkpoint) and never changes; the
parameters are installed once by Init and then changed only by ``apply``, which calls
``before_update`` first (the pull versions reading them are finished then). Not thread-safe on
its own: the shard calls it under its lock.

``apply`` may leave a spannable rule's update pending (``psserver.core.span_apply``):
``params`` finishes it before handing the parameters out, and ``live_params`` gives them with the
hook a version being sent calls before it reads a range of them.
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
from psserver.core.span_apply import SpanApply
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
        # An update still being applied span by span (``apply``), or None.
        self._pending: SpanApply | None = None
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
        """The parameters, every update applied."""
        self.settle()
        return self._params

    @property
    def length(self) -> int:
        return self._params.numel()

    def live_params(self) -> tuple[torch.Tensor, Callable[[int], None] | None]:
        """The parameters as they are, and the hook that brings elements ``[0, stop)`` up to date
        before they are read (None when no update is pending)."""
        return self._params, None if self._pending is None else self._pending.through

    def settle(self) -> None:
        """Finish the pending update, if any (its buffer is given back)."""
        if self._pending is not None:
            self._pending.finish()
            self._pending = None

    def _defers(self, kind: PayloadKind) -> bool:
        """Whether the rule can leave an update of ``kind`` pending (a spannable rule, ``apply``)."""
        return self.rule is not None and self.rule.spannable and kind in self.rule.accepted_kinds

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
        hand_over: Callable[[], Callable[[], None]] | None = None,
    ) -> tuple[PushOutcome, float]:
        """Apply a checked update with the rule and advance the clock; the outcome and the apply's seconds.

        ``hand_over`` offers ``update``'s buffer for an update its reply follows: it takes the buffer
        from its push and returns what gives it back. Where the shard applies during the reply
        (``apply_during_reply``) and the rule can (``_defers``), the update is then left pending, to
        be applied span by span as its version is read (``live_params``) or at once by ``settle``,
        and the seconds are the commit's. Otherwise it is applied at once and the buffer stays with
        its push."""
        assert self.rule is not None
        self.settle()
        self._before_update(self._params)
        if not (self._config.apply_during_reply and self._defers(kind)):
            hand_over = None  # applied at once: the buffer stays with its push
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
        if hand_over is not None:
            # A spannable rule's telemetry depends on ctx alone: an empty span gives it.
            telemetry: Telemetry = self.rule.apply(self._params[:0], update[:0], ctx)
            self._pending = SpanApply(self.rule, self._params, update, ctx, hand_over())
        else:
            telemetry = self.rule.apply(self._params, update, ctx)
        apply_seconds = time.perf_counter() - started
        self.clock += 1
        self.applied_pushes += 1
        self._applied(apply_seconds, self.clock)
        return PushOutcome(self.clock, staleness, {"staleness": float(staleness), **telemetry}), apply_seconds

    # -- checkpoint form ------------------------------------------------------------------

    def counters(self) -> dict[str, Any]:
        return {"initialized": self.initialized, "clock": self.clock, "applied_pushes": self.applied_pushes}

    def rule_state(self) -> Mapping[str, torch.Tensor]:
        self.settle()
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
