"""What a hetps server must hold in memory, and the limit its peak RSS is held to."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from benchmarks.harness.processes import vm_mb
from benchmarks.harness.settings import LR
from psserver.core.rules import RuleSpec

# Peak RSS <= RSS_FACTOR x must-hold + RSS_SLACK_MB (a Python process with torch and gRPC
# starts at about 250 MB).
RSS_FACTOR, RSS_SLACK_MB = 2.0, 350.0


def rule_state_bytes(rule: str, rule_opts: Sequence[str], length: int) -> tuple[int, bool]:
    """Bytes of ``rule``'s state for ``length`` parameters, and whether it keeps a snapshot per worker."""
    options = {"lr": str(LR), **dict(opt.split("=", 1) for opt in rule_opts)}
    built = RuleSpec.parse(rule, options).build(length)
    state = sum(t.numel() * t.element_size() for t in built.state_tensors().values())
    return state, built.needs_snapshot


def rss_limit_mb(must_hold_mb: float) -> float:
    """The most peak RSS a server that must hold ``must_hold_mb`` may reach."""
    return RSS_FACTOR * must_hold_mb + RSS_SLACK_MB


class RssTrace:
    """A process's RSS (VmRSS, MB) sampled every ``interval_s`` while the ``with`` block runs: where
    in a load the peak falls (VmHWM says only how high)."""

    def __init__(self, pid: int, interval_s: float = 0.05) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.samples: list[tuple[float, float]] = []  # (seconds since the start, MB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name=f"rss-{pid}", daemon=True)

    def _sample(self) -> None:
        started = time.perf_counter()
        while not self._stop.wait(self.interval_s):
            try:
                self.samples.append((time.perf_counter() - started, vm_mb(self.pid, "VmRSS")))
            except OSError:  # the process ended
                return

    def __enter__(self) -> RssTrace:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self, points: int = 60) -> dict[str, object]:
        """The highest sample, when it came, and at most ``points`` samples spread over the trace."""
        if not self.samples:
            return {"max_mb": None, "max_at_s": None, "samples": []}
        at, most = max(self.samples, key=lambda sample: sample[1])
        step = max(1, len(self.samples) // points)
        return {"max_mb": most, "max_at_s": at, "samples": [[round(t, 2), round(mb)] for t, mb in self.samples[::step]]}
