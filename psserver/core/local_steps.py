"""Each live worker's pace: its local steps per second, measured from its push timing.

Rules that size a worker's window of local steps from its speed, or ask when a worker will push
next, read it through the ``Paces`` their hooks are given; a rule switches the measurement on
with ``UpdateRule.paced_window``.

**Where the speed comes from: push timing, measured by the shard.** A window begins when the
worker's previous push was applied (its reply, with the parameters it computes on next, goes
out then; when its pull was held, when the pull is let go) and ends when its next push's header
arrives (right after its last local step); the steps are the push's ``steps_done`` metadata, or
the rule's window from clients that do not send it (they do not follow assignments either). So
``v_w = steps / (header_at − applied_at)``, smoothed over windows (``SPEED_SMOOTHING``).
Heartbeats were the alternative and lose: their stats are whatever a client chooses to report
(the Node worker reports none), they arrive on their own schedule, and they do not exist in the
simulator, whose shard runs on a virtual clock that push timing reads as it reads a real one.
The upload of the push is after the header and is not counted; the download of the pulled
parameters is (it precedes the first local step).

Not thread-safe on its own: the shard calls it under its lock, once per applied push.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

# Weight of the newest window in a worker's speed (an exponential moving average).
SPEED_SMOOTHING = 0.5


@dataclass
class _Pace:
    """One worker's measurement: when its current window began, its speed so far, its last window's steps."""

    window_began: float | None = None
    steps_per_second: float | None = None
    steps: float | None = None


class WorkerPaces:
    """The live workers' paces (``psserver.core.rules.base.Paces``)."""

    def __init__(self) -> None:
        self._paces: dict[int, _Pace] = {}

    def speed(self, worker_id: int) -> float | None:
        """The worker's measured local steps per second, None until known."""
        pace = self._paces.get(worker_id)
        return pace.steps_per_second if pace else None

    def known_speeds(self) -> list[float]:
        return [p.steps_per_second for p in self._paces.values() if p.steps_per_second is not None]

    def observe(
        self,
        worker_id: int,
        header_at: float,
        steps_done: float | None,
        now: float,
        live: Iterable[int],
        window: int,
    ) -> None:
        """One window of ``worker_id`` ended at ``header_at`` after ``steps_done`` steps (``window`` when the
        client did not say); its next began at ``now``. Forgets workers no longer live."""
        live_ids = set(live)
        for gone in [wid for wid in self._paces if wid not in live_ids]:
            del self._paces[gone]
        pace = self._paces.setdefault(worker_id, _Pace())
        steps = float(window) if steps_done is None else steps_done
        pace.steps = steps
        elapsed = header_at - pace.window_began if pace.window_began is not None else 0.0
        if elapsed > 0 and math.isfinite(steps) and steps >= 1:
            sample = steps / elapsed
            previous = pace.steps_per_second
            pace.steps_per_second = (
                sample if previous is None else (1 - SPEED_SMOOTHING) * previous + SPEED_SMOOTHING * sample
            )
        pace.window_began = now

    def next_push_at(self, worker_id: int, steps: float | None = None) -> float | None:
        """When ``worker_id``'s current window of ``steps`` (default: as many as its last) should end: its
        start plus its steps at its speed; None while not measured."""
        pace = self._paces.get(worker_id)
        if pace is None or pace.window_began is None or not pace.steps_per_second or pace.steps is None:
            return None
        return pace.window_began + (pace.steps if steps is None else steps) / pace.steps_per_second

    def window_restarted(self, worker_id: int, now: float) -> None:
        """``worker_id``'s window began at ``now``, later than its push (its pull waited)."""
        pace = self._paces.get(worker_id)
        if pace is not None:
            pace.window_began = now
