"""DyLU (Dynamic Local Updates): each live worker's speed, and the local steps it is assigned.

Liu, Douillard et al., 2024, "Asynchronous Local-SGD Training for Language Modeling" (arXiv
2401.09135, Eq. 6). With a windowed rule's ``window`` ``H`` and option ``dylu=true``, every push
reply assigns its worker the local steps of its next window::

    H_w = max(h_min, floor(v_w / v_ref · H))      v_ref = max over live workers (dylu_ref=p90: their 90th percentile)

``v_w`` is the worker's speed in local steps per second. Until the shard knows it (a worker's
first push only starts the measurement), ``H_w = H``. With ``dylu_ref=p90`` the workers faster
than the percentile are assigned more than ``H``: that is what the choice is for (one outlier
does not shrink everybody's window).

**Where the speed comes from: push timing, measured by the shard.** A window begins when the
worker's previous push was applied (its reply, with the parameters it computes on next, goes
out then; with ``pull_grace``, when its held pull is let go) and ends when its next push's
header arrives (right after its last local step); the steps are the push's ``steps_done``
metadata, or the rule's ``H`` from clients that do not send it (they do not follow assignments
either). So ``v_w = steps / (header_at − applied_at)``, smoothed over windows
(``SPEED_SMOOTHING``). Heartbeats were the alternative and lose: their stats are whatever a
client chooses to report (the Node worker reports none), they arrive on their own schedule, and
they do not exist in the simulator, whose shard runs on a virtual clock that push timing reads
as it reads a real one. The upload of the push is after the header and is not counted; the
download of the pulled parameters is (it precedes the first local step).

The same measurement serves ``pull_grace`` (``psserver.core.pull_hold``), which asks when each
worker's current window should end (``next_push_at``); with it and without DyLU the shard
measures speeds but assigns nothing.

Not thread-safe on its own: the shard calls it under its lock, once per applied push.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from psserver.core.config import ShardConfig
from psserver.core.consistency import ConsistencyModel
from psserver.core.receiving import PendingPush
from psserver.core.rules._windowed import WindowedOptions
from psserver.core.rules.diloco import pull_grace_of
from psserver.core.rules.options import RuleOptions
from psserver.core.workers import PushOutcome, WorkerRecord

# Weight of the newest window in a worker's speed (an exponential moving average).
SPEED_SMOOTHING = 0.5
# floor() of a ratio measured a hair below an integer (0.25 as 0.2499999999, times 20) still gives it.
_FLOOR_SLACK = 1e-9
# The telemetry key of the assignment (push replies carry it as ``PushResponse.local_steps`` too).
TELEMETRY_KEY = "local_steps"

DYLU_UNDER_BSP = (
    "DyLU (dylu=true) is for asynchronous training; under --consistency bsp every worker waits for the round "
    "anyway and the round's pushes are averaged with equal weight: drop dylu or use async"
)


def reference_speed(speeds: Sequence[float], reference: str) -> float | None:
    """``v_ref``: the largest speed (``max``) or the 90th percentile, linear between ranks (``p90``)."""
    if not speeds:
        return None
    ordered = sorted(speeds)
    if reference == "max":
        return ordered[-1]
    if reference != "p90":
        raise ValueError(f"unknown DyLU reference {reference!r}; expected max or p90")
    position = 0.9 * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (position - below) * (ordered[above] - ordered[below])


def assigned_steps(speed: float | None, reference: float | None, window: int, minimum: int) -> int:
    """Eq. 6: ``max(h_min, floor(v_w / v_ref · H))``; ``H`` while either speed is unknown."""
    if speed is None or reference is None or reference <= 0:
        return window
    return max(minimum, math.floor(speed / reference * window + _FLOOR_SLACK))


@dataclass(frozen=True)
class DyluSettings:
    """What DyLU needs of a windowed rule's options: ``H``, ``h_min`` and the reference."""

    window: int
    minimum: int
    reference: str

    @classmethod
    def of(cls, options: RuleOptions) -> DyluSettings | None:
        """The settings when the rule's options switch DyLU on; None for every other rule."""
        if not isinstance(options, WindowedOptions) or not options.dylu:
            return None
        return cls(options.window, options.dylu_min, options.dylu_ref)


def dylu_refusal(options: RuleOptions, consistency: ConsistencyModel) -> str | None:
    """Why these rule options cannot run under ``consistency``, or None."""
    if DyluSettings.of(options) is not None and consistency is ConsistencyModel.BSP:
        return DYLU_UNDER_BSP
    return None


@dataclass
class _Pace:
    """One worker's measurement: when its current window began, its speed so far, its last window's steps."""

    window_began: float | None = None
    steps_per_second: float | None = None
    steps: float | None = None


class LocalSteps:
    """The workers' speeds and their assignments (``settings``: DyLU on). Without DyLU it measures
    speeds only for ``pull_grace`` (``measure_window``: the rule's window), else it does nothing."""

    def __init__(self, settings: DyluSettings | None, measure_window: int | None = None) -> None:
        self.settings = settings
        self._window = settings.window if settings is not None else measure_window
        self._paces: dict[int, _Pace] = {}

    @classmethod
    def of(cls, config: ShardConfig) -> LocalSteps:
        """The shard's: on when its rule's options say ``dylu=true``, measuring only when they set
        ``pull_grace``, whose holds ask when each worker will push next. (The shard refuses DyLU under
        BSP before building it: ``pull_hold.consistency_refusal``.)"""
        options = config.rule.options
        grace = pull_grace_of(options) > 0
        return cls(DyluSettings.of(options), options.window if grace and isinstance(options, WindowedOptions) else None)

    def speed(self, worker_id: int) -> float | None:
        """The worker's measured local steps per second, None until known."""
        pace = self._paces.get(worker_id)
        return pace.steps_per_second if pace else None

    def assign(
        self,
        worker: WorkerRecord,
        outcome: PushOutcome,
        pushed: PendingPush,
        now: float,
        live: Iterable[WorkerRecord],
    ) -> None:
        """``worker``'s push ``pushed`` was applied at ``now``: take the window it ended (its header's
        arrival) as a speed sample, start the next one and put the assignment in ``outcome``."""
        if self._window is None:
            return
        self.observe(worker.worker_id, pushed.opened_at, pushed.metadata.get("steps_done"), now, live)
        if self.settings is not None:
            outcome.telemetry[TELEMETRY_KEY] = float(self.assigned(worker.worker_id))

    def observe(
        self, worker_id: int, header_at: float, steps_done: float | None, now: float, live: Iterable[WorkerRecord]
    ) -> None:
        """One window of ``worker_id`` ended at ``header_at`` after ``steps_done`` steps (the rule's
        ``H`` when the client did not say); its next began at ``now``. Forgets workers no longer live."""
        assert self._window is not None
        live_ids = {w.worker_id for w in live}
        for gone in [wid for wid in self._paces if wid not in live_ids]:
            del self._paces[gone]
        pace = self._paces.setdefault(worker_id, _Pace())
        steps = float(self._window) if steps_done is None else steps_done
        pace.steps = steps
        elapsed = header_at - pace.window_began if pace.window_began is not None else 0.0
        if elapsed > 0 and math.isfinite(steps) and steps >= 1:
            sample = steps / elapsed
            previous = pace.steps_per_second
            pace.steps_per_second = (
                sample if previous is None else (1 - SPEED_SMOOTHING) * previous + SPEED_SMOOTHING * sample
            )
        pace.window_began = now

    def next_push_at(self, worker_id: int) -> float | None:
        """When ``worker_id``'s current window should end: its start plus its steps (DyLU's assignment, else
        as many as its last window's) at its speed; None while not measured."""
        pace = self._paces.get(worker_id)
        if pace is None or pace.window_began is None or not pace.steps_per_second or pace.steps is None:
            return None
        steps = self.assigned(worker_id) if self.settings is not None else pace.steps
        return pace.window_began + steps / pace.steps_per_second

    def window_restarted(self, worker_id: int, now: float) -> None:
        """``worker_id``'s window began at ``now``, later than its push (its pull was held)."""
        pace = self._paces.get(worker_id)
        if pace is not None:
            pace.window_began = now

    def assigned(self, worker_id: int) -> int:
        """Eq. 6 for ``worker_id`` against the live workers' speeds known now."""
        settings = self.settings
        assert settings is not None
        known = [p.steps_per_second for p in self._paces.values() if p.steps_per_second is not None]
        reference = reference_speed(known, settings.reference)
        return assigned_steps(self.speed(worker_id), reference, settings.window, settings.minimum)
