"""The worker of a second torch.distributed.rpc peer, in a process of its own, stepped from the benchmark.

    python -m benchmarks.harness.peer_remote --port PORT --channels default

A process joins one rpc world only, and the benchmark process is already the worker of the
peer the targets are judged against (TensorPipe restricted to TCP). The reference peer on
TensorPipe's default channels therefore gets its worker here: it joins that peer's world, and
reads commands from stdin, one a line, answering each on stdout with ``ok`` or ``error REASON``:

- ``init KEY LENGTH SEED``: parameters ``randn(LENGTH) * 0.01`` (generator seeded ``SEED``) on
  the server under ``KEY``, and an update ``randn(LENGTH) * 1e-4`` to push;
- ``step KEY``: one ``push_and_pull`` into a preallocated buffer, checked finite;
- ``quit``: leave the world (the server's graceful shutdown waits for it) and exit.

:class:`RemotePeerStep` is its :class:`~benchmarks.harness.steps.StepSystem`: the benchmark
times the round trip of a ``step`` line, which adds a pipe round trip (tens of microseconds) to
the peer's step; its client CPU is this process's.

On default channels TensorPipe's threads poll while idle (the server and this worker took about
a quarter of a core each between steps on the 2-core machine), which would slow every other
system measured beside them. So both processes are held stopped (SIGSTOP) between commands and
let go (SIGCONT) only while one runs; the step's time includes their waking.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
from typing import IO

import torch
from torch.distributed import rpc

from benchmarks.harness import torch_rpc_peer
from benchmarks.harness.processes import REPO_ROOT, child_environment
from benchmarks.harness.settings import LR
from psserver.allocator import WORKER, apply_allocator
from pstools.warm_start import stop_process


class RemotePeerError(RuntimeError):
    """The remote worker answered a command with an error, or went away."""


class RemoteWorker:
    """The process that joined the peer's world, and the line protocol to it."""

    def __init__(self, port: int, channels: str, torch_threads: int, server_pid: int | None = None) -> None:
        command = [sys.executable, "-m", "benchmarks.harness.peer_remote", "--port", str(port)]
        command += ["--channels", channels, "--torch-threads", str(torch_threads)]
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            env=child_environment(),
        )
        # Held stopped between commands along with this worker (see the module's docstring).
        self._held = [pid for pid in (server_pid, self.process.pid) if pid is not None]

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    def _signal(self, signal_number: int) -> None:
        for pid in self._held:
            with contextlib.suppress(ProcessLookupError):  # exited: ask() reports it
                os.kill(pid, signal_number)

    def ask(self, line: str) -> None:
        """Run one command, the worker and its server let go only meanwhile; ``ok`` or raise."""
        self._signal(signal.SIGCONT)
        try:
            self._ask(line)
        finally:
            if line != "quit":
                self._signal(signal.SIGSTOP)

    def _ask(self, line: str) -> None:
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        try:
            stdin.write(line + "\n")
            stdin.flush()
        except BrokenPipeError:
            raise RemotePeerError(f"the remote peer worker exited ({self.process.poll()})") from None
        answer = stdout.readline().strip()
        if answer != "ok":
            raise RemotePeerError(f"{line!r}: {answer or f'the remote peer worker exited ({self.process.poll()})'}")

    def close(self) -> None:
        """Let the processes go, quit the worker (its server's graceful shutdown then ends too)."""
        self._signal(signal.SIGCONT)
        if self.process.poll() is None:
            try:
                self.ask("quit")
                self.process.wait(timeout=30)
            except (RemotePeerError, subprocess.TimeoutExpired):
                pass
        stop_process(self.process)


class RemotePeerStep:
    """A step of one model through the remote worker (the update and parameters live there)."""

    def __init__(self, worker: RemoteWorker, key: str, length: int, seed: int = 0) -> None:
        self.worker = worker
        self.key = key
        self.client_pids: tuple[int, ...] = (worker.pid,)
        worker.ask(f"init {key} {length} {seed}")

    def step(self, update: torch.Tensor, out: torch.Tensor) -> None:
        # ``update`` and ``out`` are the benchmark's; this system's own live in the remote worker.
        self.worker.ask(f"step {self.key}")

    def close(self) -> None:
        pass  # the worker is shared by every model's step; its owner closes it


def serve_commands(lines: IO[str], answers: IO[str]) -> None:
    held: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for line in lines:
        words = line.split()
        if not words:
            continue
        if words[0] == "quit":
            break
        try:
            if words[0] == "init" and len(words) == 4:
                key, length, seed = words[1], int(words[2]), int(words[3])
                generator = torch.Generator().manual_seed(seed)
                flat = torch.randn(length, generator=generator) * 0.01
                update = torch.randn(length, generator=generator) * 1e-4
                rpc.rpc_sync(torch_rpc_peer.SERVER_NAME, torch_rpc_peer.init_params, args=(key, flat, LR))
                held[key] = (update, torch.empty(length))
            elif words[0] == "step" and len(words) == 2:
                update, out = held[words[1]]
                params = rpc.rpc_sync(torch_rpc_peer.SERVER_NAME, torch_rpc_peer.push_and_pull, args=(words[1], update))
                out.copy_(params)  # into the worker's buffer, as the other systems do
                if not bool(torch.isfinite(out).all()):
                    raise ValueError("non-finite parameters came back")
            else:
                raise ValueError(f"unknown command {line.strip()!r}")
        except (KeyError, ValueError, RuntimeError) as error:
            answers.write(f"error {type(error).__name__}: {error}\n".replace("\n", " ").rstrip() + "\n")
        else:
            answers.write("ok\n")
        answers.flush()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the worker of a torch.distributed.rpc peer, driven over stdin")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--channels", choices=torch_rpc_peer.CHANNELS, default="default")
    parser.add_argument("--torch-threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.torch_threads)
    torch_rpc_peer.connect(args.port, args.channels)
    try:
        serve_commands(sys.stdin, sys.stdout)
    finally:
        rpc.shutdown()


if __name__ == "__main__":
    apply_allocator(WORKER)
    main()
