"""How the integration tests start a real ``psworker train`` process on the digits task."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pscli.config_file import dump_toml, merged


def train_command(
    address: str,
    name: str,
    until_clock: int,
    *,
    seed: int = 0,
    slowdown: float = 1.0,
    log: Path | None = None,
    extra: Sequence[str] = (),
    settings: Mapping[str, Any] | None = None,
) -> list[str]:
    """``python -m psworker train`` against ``address`` with no progress bar and no evaluation; ``settings`` are keys of
    its ``--config`` file (``{"train": {"step_seconds": 0.02}}``) and ``extra`` flags come last."""
    table = merged({"train": {"progress": False, "eval_every": 0, "seed": seed}}, settings or {})
    with tempfile.NamedTemporaryFile("w", suffix=".toml", prefix=f"{name}-", delete=False) as file:
        file.write(dump_toml(table))
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
        "--config",
        file.name,
    ]
    if log is not None:
        command += ["--log-file", str(log)]
    return [*command, *extra]


def start_train(command: list[str]) -> subprocess.Popen[str]:
    """The worker process, its stdout (the JSON summary) and stderr piped for the test to read."""
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
