"""Starting the local cluster's programs warm: forked from a process that has imported torch already.

A fresh ``python -m psserver serve`` or ``python -m pstools train`` spends about 3 s of CPU
importing torch before it does anything (on a 2-core host, four workers starting at once take
twice that in wall time). The launcher instead asks multiprocessing's *forkserver* for them: one
process, started on first use, imports :data:`PRELOAD` once, and every program is a fork of it
that runs the module as ``python -m MODULE ARGS`` would (same ``sys.argv``, environment and exit
code), with its output in a log file. They are real processes all the same: their own pid,
sockets, signals and exit status; a program killed by a signal reports ``-signal``, as
``subprocess`` does. The forkserver has started no thread of torch's or gRPC's own when it forks
(imports start none), so each child starts its own.
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Protocol

# What both programs import before they do anything (torch is most of it); kept free of gRPC
# channels, servers and threads so a fork of it is sound.
PRELOAD = ("torch", "numpy", "click", "psserver.app", "pstasks.cli", "pstools.cli")


class Program(Protocol):
    """A started program: a :class:`WarmProcess` or a :class:`subprocess.Popen`."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...


def _context() -> ForkServerContext:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    return context


def _run_module(module: str, argv: Sequence[str], log_path: str, environment: Mapping[str, str]) -> None:
    """In the forked child: output to ``log_path``, this environment and argv, then ``python -m module``."""
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.environ.clear()
    os.environ.update(environment)
    # The forkserver ignores SIGINT for itself; a program gets the default, as a fresh one would.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


class WarmProcess:
    """A started program, with the part of :class:`subprocess.Popen` the launcher and tests use."""

    def __init__(self, process: BaseProcess, args: list[str]) -> None:
        self._process = process
        self.args = args

    @property
    def pid(self) -> int:
        assert self._process.pid is not None
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        if self._process.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self._process.exitcode

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start_program(
    module: str, argv: Sequence[str], log_path: Path, environment: Mapping[str, str] | None = None
) -> WarmProcess:
    """``python -m module *argv`` as a fork of the warm process, output (stdout and stderr) to
    ``log_path``; ``environment`` adds to (or overrides) this process's environment."""
    env = {**os.environ, **(environment or {})}
    process = _context().Process(
        target=_run_module, args=(module, list(argv), str(log_path), env), name=f"{module} {' '.join(argv[:1])}"
    )
    # A daemon: stopped (SIGTERM) when this process exits, so no program outlives its launcher.
    process.daemon = True
    process.start()
    return WarmProcess(process, [sys.executable, "-m", module, *argv])


def stop_process(process: Program, timeout_s: float = 20.0) -> int:
    """SIGTERM, wait, SIGKILL if it does not stop; returns the exit code."""
    if process.poll() is not None:
        return process.wait()
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()
