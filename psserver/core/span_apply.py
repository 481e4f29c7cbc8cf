"""An update applied span by span while the reply carrying its result is built (``--apply-during-reply``).

A PushPull answers with the parameters its own push produced. Applied whole, the rule's pass over
the shard lies between the push's last chunk and the reply's first byte; for a rule whose apply
touches each element on its own (``UpdateRule.spannable``) the shard instead commits the push
(clock, staleness, acknowledgement) and leaves its elements to be updated span by span: the
reply's message for a range of elements first brings that range up to date, so each span's update
is made right before its bytes are copied out, and the first message leaves after one span's
update instead of the whole pass. The result is the same tensor: a spannable rule applied to each
span in turn gives what it gives applied to the whole.

Contract with the model that owns the parameters: while an update is pending, nobody reads or
writes the parameters or the update except through it. The model calls :meth:`SpanApply.finish`
(under the shard lock) before any other use of the parameters, and the version being sent reads
them only after :meth:`SpanApply.through`. The update's buffer (a push's receive buffer) is given
back by ``done`` once the last span is applied, never before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch

from psserver.core.rules.base import PushContext, UpdateRule
from psserver.core.rules.options import RuleOptions

# Elements per span: 1 MiB of fp32, the default chunk of a reply, small enough to stay in cache
# between its update and its copy into a message.
SPAN_ELEMENTS = 256 * 1024


class SpanApply:
    """One push's update of ``params``, made span by span on demand and exactly once."""

    def __init__(
        self,
        rule: UpdateRule[RuleOptions],
        params: torch.Tensor,
        update: torch.Tensor,
        ctx: PushContext,
        done: Callable[[], None],
        span_elements: int | None = None,
    ) -> None:
        if not rule.spannable:
            raise ValueError(f"rule {rule.name} is not spannable: its apply must see the whole shard")
        self._rule = rule
        self._params = params
        self._update = update
        self._ctx = ctx
        self._done: Callable[[], None] | None = done
        self._span = span_elements or SPAN_ELEMENTS
        self._applied = 0  # elements [0, _applied) are up to date
        self._lock = threading.Lock()

    @property
    def finished(self) -> bool:
        with self._lock:
            return self._done is None

    def through(self, stop: int) -> None:
        """Bring elements ``[0, stop)`` up to date (whole spans, so possibly a few more)."""
        with self._lock:
            length = self._params.numel()
            while self._applied < min(stop, length):
                end = min(self._applied + self._span, length)
                self._rule.apply(self._params[self._applied : end], self._update[self._applied : end], self._ctx)
                self._applied = end
            if self._applied >= length and self._done is not None:
                done, self._done = self._done, None
                done()

    def finish(self) -> None:
        """Apply every span not applied yet, and give the update's buffer back."""
        self.through(self._params.numel())
