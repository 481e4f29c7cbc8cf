"""How the integration tests start a real ``psworker train`` process on the digits task."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path


def train_command(
    address: str,
    name: str,
    until_clock: int,
    *,
    seed: int = 0,
    slowdown: float = 1.0,
    eval_every: int = 0,
    log: Path | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """``python -m psworker train`` against ``address`` with no progress bar; ``extra`` flags last."""
    command = [
        sys.executable,
        "-m",
        "psworker",
        "train",
        "--server",
        address,
        "--task",
        "digits",
        "--name",
        name,
        "--slowdown",
        str(slowdown),
        "--until-clock",
        str(until_clock),
        "--no-progress",
        "--eval-every",
        str(eval_every),
        "--seed",
        str(seed),
    ]
    if log is not None:
        command += ["--log-file", str(log)]
    return [*command, *extra]


def start_train(command: list[str]) -> subprocess.Popen[str]:
    """The worker process, its stdout (the JSON summary) and stderr piped for the test to read."""
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
