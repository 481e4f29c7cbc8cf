"""How the integration tests start a real ``psworker train`` process on the digits task."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pscli.config_file import dump_toml, merged
from pstools.warm_start import WarmProcess, start_program


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


class WarmTrain:
    """A ``psworker train`` forked warm (:func:`pstools.warm_start.start_program`, as the local cluster
    starts its workers): a real process of its own (pid, signals, exit status) that skips the ~3 s of
    CPU a fresh interpreter spends importing torch. Its stdout and stderr go together to ``output``."""

    def __init__(self, command: Sequence[str], output: Path) -> None:
        interpreter, dash_m, module, *argv = command
        assert (interpreter, dash_m, module) == (sys.executable, "-m", "psworker"), command
        self.output = output
        self.process: WarmProcess = start_program("psworker", argv, output)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.returncode

    def poll(self) -> int | None:
        return self.process.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.process.wait(timeout)

    def send_signal(self, sig: int) -> None:
        self.process.send_signal(sig)

    def kill(self) -> None:
        self.process.kill()

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Wait for the exit (``subprocess.TimeoutExpired`` past ``timeout``); the output twice, as
        (stdout, stderr): the summary is its last line, any error above it."""
        self.process.wait(timeout)
        text = self.output.read_text()
        return text, text
