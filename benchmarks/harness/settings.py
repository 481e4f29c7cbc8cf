"""How long and how much the throughput family of benchmarks measures, and the constants they share."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from benchmarks.harness.models import REFERENCE_MODEL

LR = 0.01
# Workers of a benchmark idle between sections; they must not be evicted meanwhile.
# What every benchmarked hetps server's ``--config`` file holds (benchmarks.harness.processes).
SERVER_CONFIG = {"torch_threads": 1, "shard": {"lease_seconds": 3600.0}}
TORCH_THREADS = 1  # per process: servers run with torch_threads = 1, the clients too


@dataclass(frozen=True)
class Settings:
    """One set for every measurement, so the full run's JSON states all of them in one place."""

    models: tuple[str, ...] = ("resnet18", "small")
    repeats: int = 9
    # Steps of every system before timing, at least: each then warms on until its processes' memory
    # holds still (steps.warm_up). A peer given one step was still 5x slower in its first repeat
    # (297.7 ms, then 55.8); validity.repeat_spread_check catches one that needed more.
    warmup: int = 3
    steps: dict[str, int] = field(default_factory=lambda: {"resnet18": 6, "small": 40, "tiny": 1})
    concurrency: tuple[int, ...] = (1, 4, 16)
    apply_length: int = 11_689_512
    apply_samples: int = 15
    rss_workers: int = 4
    rss_seconds: float = 8.0
    # server_memory's large model (one ASGD shard, the largest concurrency level's workers at once),
    # its workers sharing a process (and one update and output) this many at a time.
    large_model: str = "gpt2-small"
    pushers_per_process: int = 8

    @classmethod
    def quick(cls) -> Settings:
        return cls(
            repeats=3,
            warmup=3,
            steps={"resnet18": 4, "small": 15, "tiny": 1},
            apply_samples=6,
            rss_seconds=4.0,
        )

    @classmethod
    def smoke(cls) -> Settings:
        return cls(
            models=("tiny",),
            repeats=2,
            warmup=1,
            steps={"tiny": 2},
            concurrency=(1, 2),
            apply_length=20_000,
            apply_samples=2,
            rss_workers=2,
            rss_seconds=0.3,
            large_model="small",
        )

    @property
    def reference(self) -> str:
        """The model the targets are judged on: ResNet-18 size when the run has it."""
        return REFERENCE_MODEL if REFERENCE_MODEL in self.models else self.models[0]


def parse_speed_mix(text: str) -> list[float]:
    """Slowdowns of a speed mix such as ``1:1:2:4``, one per worker; an ArgumentTypeError says what
    is wrong (a script's argparse reports it with the option's name, exit 2)."""
    try:
        speeds = [float(part) for part in text.split(":")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a speed mix like 1:1:2:4") from None
    if any(s < 1 for s in speeds):
        raise argparse.ArgumentTypeError(f"{text!r}: every slowdown must be >= 1")
    return speeds
