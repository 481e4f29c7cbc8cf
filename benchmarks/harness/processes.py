"""Server processes of a benchmark run: started, found through their ready file, watched, stopped.

Every server writes a ready file (``psserver serve --ready-file``; the bare gRPC mover and the
torch.distributed.rpc peer write the same format, ``psserver/ready.py``), and the harness waits
for it with :func:`psserver.ready.wait_for_ready_file`: nothing reads a server's stdout.
CPU time and memory of a process come from ``/proc``.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from benchmarks.harness.settings import LR, SERVER_CONFIG, TORCH_THREADS
from pscli.config_file import dump_toml, merged
from psserver.ready import ReadyInfo, wait_for_ready_file
from pstools.warm_start import stop_process

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVER_START_TIMEOUT_S = 180.0  # a busy 2-core host took over 60 s to start eight servers at once


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, every thread) ``pid`` has used so far; clock-tick resolution."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # After the command name: field 14 (utime) and 15 (stime) of proc(5) are the 12th and 13th here.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_of(pids: Sequence[int]) -> float:
    """CPU seconds of all of ``pids`` together."""
    return sum(cpu_seconds(pid) for pid in pids)


def vm_mb(pid: int, field_name: str) -> float:
    """A ``/proc/PID/status`` memory field (VmHWM, VmRSS) in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) * 1024 / 1e6
    return math.nan


def use_one_torch_thread() -> None:
    """Initializer of pool processes: one torch thread each, so parallel runs do not oversubscribe."""
    import torch

    torch.set_num_threads(1)


def child_environment(environment: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment with the repository importable, plus ``environment``."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    return env | dict(environment or {})


def _entry(server: str, profile: Path | None) -> list[str]:
    """The interpreter arguments that start ``server`` (``psserver`` or ``bare``), profiled if ``profile`` is given."""
    if profile is not None:
        return ["-m", "benchmarks.harness.profiled", "--stats", str(profile), server]
    return ["-m", "psserver"] if server == "psserver" else ["-m", "benchmarks.harness.bare_grpc"]


class HetpsJob(NamedTuple):
    """A hetps server to start: what :meth:`Fleet.start_hetps` takes."""

    label: str
    model: str
    rule: str
    rule_opts: tuple[str, ...]
    shard_index: int
    num_shards: int
    extra_args: tuple[str, ...] = ()  # more ``psserver serve`` flags
    # Set over SERVER_CONFIG in the server's ``--config`` file.
    config: Mapping[str, Any] | None = None


@dataclass
class ServerProcess:
    label: str
    kind: str  # hetps, bare, peer (the targets' and the reference on default channels)
    process: subprocess.Popen[str]
    ready: ReadyInfo
    rule: str = ""
    rule_opts: tuple[str, ...] = ()
    model: str = ""
    shard_index: int = 0
    num_shards: int = 1
    rss_at_start_mb: float = math.nan
    workers: int = 0  # the most workers that pushed to it at once
    # Peak RSS (VmHWM, MB) when each phase of the run ended.
    peak_rss_after: dict[str, float] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    @property
    def address(self) -> str:
        return self.ready.address


class Fleet:
    """Every server process of a run; :meth:`stop` stops them all."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.servers: list[ServerProcess] = []

    def _start(
        self, label: str, command: list[str], environment: Mapping[str, str] | None
    ) -> tuple[subprocess.Popen[str], ReadyInfo]:
        ready_file = self.log_dir / f"{label}.ready.json"
        ready_file.unlink(missing_ok=True)
        with (self.log_dir / f"{label}.log").open("w") as log:
            process = subprocess.Popen(
                [*command, "--ready-file", str(ready_file)],
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
                cwd=REPO_ROOT,
                env=child_environment(environment),
            )
        try:
            ready = wait_for_ready_file(ready_file, process, SERVER_START_TIMEOUT_S)
        except BaseException:
            stop_process(process)
            raise
        return process, ready

    def _add(self, server: ServerProcess) -> ServerProcess:
        server.rss_at_start_mb = vm_mb(server.pid, "VmRSS")
        self.servers.append(server)
        return server

    def start_hetps(
        self, job: HetpsJob, *, environment: Mapping[str, str] | None = None, profile: Path | None = None
    ) -> ServerProcess:
        """``job``'s ``psserver serve`` on a free loopback port; its log is ``LOG_DIR/LABEL.log``. With
        ``profile`` it runs under ``benchmarks.harness.profiled``, which writes its profile there."""
        command = [sys.executable, *_entry("psserver", profile), "serve", "--host", "127.0.0.1", "--port", "0"]
        command += ["--rule", job.rule, "--lr", repr(LR), "--shard-index", str(job.shard_index)]
        command += ["--num-shards", str(job.num_shards), "--metrics-port", "0"]
        config_file = self.log_dir / f"{job.label}.toml"
        config_file.write_text(dump_toml(merged(SERVER_CONFIG, job.config or {})))
        command += ["--config", str(config_file)]
        for option in job.rule_opts:
            command += ["--rule-opt", option]
        process, ready = self._start(job.label, [*command, *job.extra_args], environment)
        job_facts = (job.rule, tuple(job.rule_opts), job.model, job.shard_index, job.num_shards)
        return self._add(ServerProcess(job.label, "hetps", process, ready, *job_facts))

    def start_all(self, jobs: Sequence[HetpsJob]) -> dict[str, ServerProcess]:
        """Start every job's hetps server at once (start-up is mostly imports); by label."""
        with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as pool:
            started = list(pool.map(self.start_hetps, jobs))
        return {server.label: server for server in started}

    def start_helper(
        self, label: str, kind: str, module: str, extra_args: Sequence[str] = (), profile: Path | None = None
    ) -> ServerProcess:
        """A comparison server (``benchmarks.harness.bare_grpc``, ``benchmarks.harness.torch_rpc_peer``) of ``kind``,
        with the torch thread count of a hetps server (and, set by its entry point, the same allocator settings).
        With ``profile`` (the bare mover only) it runs under ``benchmarks.harness.profiled``."""
        if profile is not None and module != "benchmarks.harness.bare_grpc":
            raise ValueError(f"only the bare gRPC mover runs profiled, not {module}")
        entry = ["-m", module] if profile is None else _entry("bare", profile)
        command = [sys.executable, *entry, "--torch-threads", str(TORCH_THREADS), *extra_args]
        process, ready = self._start(label, command, None)
        return self._add(ServerProcess(label, kind, process, ready))

    def checkpoint(self, phase: str) -> None:
        """Record every live server's peak RSS so far, as of the end of ``phase``."""
        for server in self.servers:
            if server.process.poll() is None:
                server.peak_rss_after[phase] = vm_mb(server.pid, "VmHWM")

    def stop(self) -> None:
        for server in self.servers:
            stop_process(server.process, timeout_s=20.0 if server.kind == "hetps" else 10.0)
