"""The simulator's configuration, speed models and results (see :mod:`pstools.simulate`)."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


class SimulationError(ValueError):
    """A configuration the simulator cannot run."""


# -- speeds ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpeedModel:
    """How long each worker's step takes, in virtual seconds.

    ``constant``: every step takes ``step_s``. ``groups``: worker ``r`` takes
    ``step_s × ratios[r mod len(ratios)]`` (``1:1:2:4``). ``exponential``: exponentially
    distributed with that mean. ``profile``: drawn from the step times a real run measured
    (one list per worker, cycled over ranks; see :func:`load_profile`).
    """

    kind: str = "constant"
    ratios: tuple[float, ...] = (1.0,)
    step_s: float = 1.0
    profile: tuple[tuple[float, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in {"constant", "groups", "exponential", "profile"}:
            raise SimulationError(f"unknown speed model {self.kind!r}; use constant, groups, exponential or profile")
        if not self.ratios or any(r <= 0 for r in self.ratios) or self.step_s <= 0:
            raise SimulationError("speed ratios and the step time must be positive")
        if self.kind == "profile" and not any(self.profile):
            raise SimulationError("a profile speed model needs at least one measured step time")

    @classmethod
    def parse(cls, text: str, step_s: float = 1.0) -> SpeedModel:
        """``constant``, ``1:1:2:4`` (groups), ``exp`` or ``exp:1:1:2:4``, ``profile:LOG_DIR``."""
        text = text.strip()
        if text in {"", "constant"}:
            return cls("constant", step_s=step_s)
        kind, _, rest = text.partition(":")
        if kind == "profile":
            return cls("profile", step_s=step_s, profile=load_profile(Path(rest)))
        if kind in {"exp", "exponential"}:
            return cls("exponential", _ratios(rest or "1"), step_s)
        return cls("groups", _ratios(text), step_s)

    def slowdown(self, rank: int) -> float:
        if self.kind == "profile":
            times = self.profile[rank % len(self.profile)]
            return sum(times) / len(times) / self.step_s
        return 1.0 if self.kind == "constant" else self.ratios[rank % len(self.ratios)]

    def sampler(self, rank: int, rng: random.Random) -> Callable[[], float]:
        mean = self.step_s * self.slowdown(rank)
        if self.kind == "exponential":
            return lambda: rng.expovariate(1.0 / mean)
        if self.kind == "profile":
            times = self.profile[rank % len(self.profile)]
            return lambda: rng.choice(times)
        return lambda: mean


def _ratios(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.replace(",", ":").split(":") if part.strip())
    except ValueError:
        raise SimulationError(f"{text!r} is not a list of speed ratios such as 1:1:2:4") from None
    if not values:
        raise SimulationError("give at least one speed ratio")
    return values


def load_profile(log_dir: Path) -> tuple[tuple[float, ...], ...]:
    """Per-worker step times (seconds) from a real run's JSON-lines logs (``worker-*.jsonl``).

    Step events are logged every few steps with the time since start; each interval divided
    by the steps it covers is one sample. A worker with no step events contributes its
    ``compute_seconds_per_step`` from the ``done`` event.
    """
    files = sorted(log_dir.glob("worker-*.jsonl")) if log_dir.is_dir() else [log_dir]
    profiles = []
    for path in files:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        steps = [(r["step"], r["time"]) for r in records if r.get("event") == "step"]
        times = [(t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in itertools.pairwise(steps) if s1 > s0]
        times = [t for t in times if t > 0]
        if not times:
            done = [r for r in records if r.get("event") == "done" and r.get("compute_seconds_per_step")]
            times = [float(done[-1]["compute_seconds_per_step"])] if done else []
        if times:
            profiles.append(tuple(times))
    if not profiles:
        raise SimulationError(f"no step times found in {log_dir} (expected worker-*.jsonl from psworker train)")
    return tuple(profiles)


# -- configuration and results ------------------------------------------------------------------


@dataclass(frozen=True)
class SimSettings:
    """The keys of ``psworker simulate --config``: what the command line leaves to a file."""

    # Virtual seconds of a full-speed step (the speed model's unit).
    step_seconds: float = 1.0
    # SSP's bound s (with consistency ssp).
    ssp_bound: int = 3
    # Evaluate on the test set every this many steps.
    eval_every: int = 100
    # Seed of the workers' samplers and the speed model.
    seed: int = 0
    # Threads torch computes with.
    torch_threads: int = 1
    # With int8 pushes, each worker carries its quantisation error into its next push.
    error_feedback: bool = True

    def __post_init__(self) -> None:
        for key in ("step_seconds", "eval_every", "torch_threads"):
            if not getattr(self, key) > 0:
                raise ValueError(f"{key} must be positive, not {getattr(self, key)}")
        if self.ssp_bound < 0:
            raise ValueError(f"ssp_bound must be 0 or more, not {self.ssp_bound}")


@dataclass(frozen=True)
class SimConfig:
    rule: str = "asgd"
    options: Mapping[str, str] = field(default_factory=dict)  # the rule's options, lr included
    workers: int = 4
    speeds: SpeedModel = field(default_factory=SpeedModel)
    consistency: str = "async"  # async, ssp or bsp
    ssp_bound: int = 3
    delay: int | None = None  # constant-delay mode: every gradient applied exactly D updates late
    task: str = "digits"
    data_dir: str | None = None  # where built-in tasks read data files (None: $HETPS_DATA_DIR or the default)
    steps: int = 1000  # budget: gradients computed by all workers together
    max_updates: int | None = None  # also stop once the shard's clock reaches this
    eval_every: int = 100  # in steps
    seed: int = 0
    # The task's metric to reach (psworker.task.Metric): an accuracy at least this high, or a
    # loss at most this low; time_to_target_s is when an evaluation first got there.
    target: float | None = None
    stop_at_target: bool = False
    record_pushes: bool = True
    push_dtype: str = "fp32"  # what pushes are encoded in (psproto.codec.PUSH_DTYPE_NAMES): int8 runs the 8-bit codec
    error_feedback: bool = True  # int8 pushes: each worker carries its quantisation error into its next push

    def describe(self) -> dict[str, Any]:
        data = asdict(self)
        data["options"] = dict(self.options)
        data["speeds"] = {"kind": self.speeds.kind, "ratios": list(self.speeds.ratios), "step_s": self.speeds.step_s}
        return data


@dataclass
class CurvePoint:
    virtual_s: float
    clock: int
    steps: int
    samples: int
    test_accuracy: float
    test_loss: float
    train_loss: float


@dataclass
class WorkerStats:
    rank: int
    slowdown: float
    steps: int = 0
    pushes: int = 0
    staleness_sum: int = 0
    max_staleness: int = 0
    parked_s: float = 0.0
    # Steps up to the worker's last push (the steps of a window still open are not pushed yet).
    steps_pushed: int = 0
    # The local steps of its next window the shard assigned with the worker's last push (0: none assigned).
    local_steps: int = 0

    @property
    def mean_staleness(self) -> float:
        return self.staleness_sum / self.pushes if self.pushes else 0.0

    @property
    def steps_per_push(self) -> float:
        return self.steps_pushed / self.pushes if self.pushes else 0.0


@dataclass
class SimResult:
    config: dict[str, Any]
    curve: list[CurvePoint]
    workers: list[WorkerStats]
    staleness_histogram: dict[int, int]
    telemetry: dict[str, float]  # mean of every telemetry key over pushes
    pushes: list[tuple[float, int, int]]  # (virtual time, rank, staleness) of every push
    test_accuracy: float
    test_loss: float
    clock: int
    steps: int
    samples: int
    virtual_s: float
    wall_s: float
    diverged: bool
    time_to_target_s: float | None = None
    steps_to_target: int | None = None
    # The task's metric, its direction and its final value (test_accuracy or test_loss).
    metric: str = "accuracy"
    higher_is_better: bool = True
    metric_value: float = math.nan

    @property
    def mean_staleness(self) -> float:
        total = sum(self.staleness_histogram.values())
        return sum(k * v for k, v in self.staleness_histogram.items()) / total if total else 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["mean_staleness"] = self.mean_staleness
        for stats in data["workers"]:
            stats["mean_staleness"] = stats["staleness_sum"] / stats["pushes"] if stats["pushes"] else 0.0
            stats["steps_per_push"] = stats["steps_pushed"] / stats["pushes"] if stats["pushes"] else 0.0
        data["staleness_histogram"] = {str(k): v for k, v in sorted(self.staleness_histogram.items())}
        return data
