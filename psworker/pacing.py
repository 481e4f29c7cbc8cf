"""How long a worker's step takes: emulated device speed, shared by every training loop.

A worker with slowdown X runs X times slower than a full-speed one. Without a step time the
slowdown multiplies the step's measured compute time (the worker idles (X − 1) compute times).
With a step time ``T`` every step lasts ``X · T`` — an emulated accelerator of fixed speed, so
speeds do not change with how busy the host's CPUs are — unless its compute takes longer, which
is counted as an overrun (the host was too slow to emulate that device).
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class Pace:
    slowdown: float = 1.0
    # Seconds of a full-speed step; None: scale the measured compute time instead.
    step_seconds: float | None = None
    steps: int = 0
    overruns: int = 0
    emulated_seconds: float = 0.0

    def __post_init__(self) -> None:
        if self.slowdown < 1.0:
            raise ValueError(f"slowdown {self.slowdown} must be >= 1 (1 = full speed)")
        if self.step_seconds is not None and self.step_seconds <= 0:
            raise ValueError(f"step time {self.step_seconds} must be > 0 seconds")

    def finish_step(self, compute_seconds: float) -> float:
        """Idle until the step has lasted as long as the emulated device takes; its duration."""
        if self.step_seconds is None:
            duration = compute_seconds * self.slowdown
        else:
            duration = self.step_seconds * self.slowdown
            if compute_seconds > duration:
                self.overruns += 1
                duration = compute_seconds
        idle = duration - compute_seconds
        if idle > 0:
            time.sleep(idle)
        self.steps += 1
        self.emulated_seconds += duration
        return duration

    @property
    def overrun_fraction(self) -> float:
        return self.overruns / self.steps if self.steps else 0.0
