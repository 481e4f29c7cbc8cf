"""Throughput of hetps against the transport's ceiling, a torch.distributed.rpc peer and torch.optim, in one run.

    python -m benchmarks.throughput [--quick] [--repeats N] [--out benchmarks/results/throughput.json]

Everything runs on loopback, each server in its own process and every client in this one
(the concurrency section's workers in their own processes). Sections:

1. **steps** — a worker step (push a gradient, get the parameters back) for a ResNet-18-sized
   model (11,689,512 fp32 parameters) and a ~100k-parameter model through: hetps (1 and 2
   shards, fp32 and bf16 on the wire); a bare gRPC byte mover with the same chunking
   (``benchmarks._bare_grpc``, the transport's ceiling); and a ``torch.distributed.rpc``
   parameter server (``benchmarks._torch_rpc_peer``, TensorPipe over TCP, fp32).
   Systems are interleaved step by step, so ratios compare like with like on a busy machine.
2. **concurrency** — aggregate steps/s of 1, 4 and 16 worker processes on one hetps shard.
3. **apply** — server-side apply time of every update rule on 11.7M parameters against
   ``torch.optim.SGD(momentum=0.9, fused=True)``, interleaved sample by sample.
4. **memory** — peak RSS (VmHWM) of every hetps server against the bytes it must hold
   (parameters + rule state + one snapshot per worker for rules that need snapshots).

Prints one table per section and the targets with PASS/MISS; writes medians, spreads and
ratios as JSON. ``--quick`` is a shorter run; ``--smoke`` (tests) a tiny one.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import multiprocessing
import multiprocessing.queues
import os
import platform
import queue
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

import grpc
import torch
from rich.console import Console
from rich.table import Table
from torch.distributed import rpc

from benchmarks import _bare_grpc, _torch_rpc_peer
from benchmarks.models import resnet18_shapes, small_shapes
from psproto import codec
from psproto.layout import Layout
from psproto.tuning import MALLOC_SETTINGS, apply_malloc_tuning
from psserver.core.rules import RULES, PayloadKind, PushContext, RuleSpec
from psworker.client import PSClient
from psworker.launcher import start_server, stop_process

REPO_ROOT = Path(__file__).resolve().parents[1]
Shapes = list[tuple[str, tuple[int, ...]]]
Summary = dict[str, float]


def tiny_shapes() -> Shapes:
    """A few thousand parameters in four tensors (smoke tests only)."""
    return [("fc1.weight", (32, 64)), ("fc1.bias", (32,)), ("fc2.weight", (10, 32)), ("fc2.bias", (10,))]


MODELS: dict[str, Callable[[], Shapes]] = {"resnet18": resnet18_shapes, "small": small_shapes, "tiny": tiny_shapes}
REFERENCE_MODEL = "resnet18"
LR = 0.01
# Workers of the benchmark idle between sections; they must not be evicted meanwhile.
SERVER_ARGS = ("--lease-seconds", "3600")
TORCH_THREADS = 1  # per process: servers run with --torch-threads 1, the clients here too

# The targets of the issue: (key, description, comparison, threshold).
PEER_FP32, PEER_BF16 = 0.8, 1.3
BARE_FRACTION = 0.9
MOMENTUM_APPLY, GAP_AWARE_APPLY = 1.3, 2.5
RSS_FACTOR, RSS_SLACK_MB = 1.5, 300.0


@dataclass(frozen=True)
class Settings:
    models: tuple[str, ...] = ("resnet18", "small")
    repeats: int = 9
    warmup: int = 2
    steps: dict[str, int] = field(default_factory=lambda: {"resnet18": 6, "small": 40, "tiny": 1})
    concurrency: tuple[int, ...] = (1, 4, 16)
    concurrency_repeats: int = 4
    concurrency_seconds: float = 8.0
    apply_length: int = 11_689_512
    apply_samples: int = 15
    rss_workers: int = 4
    rss_seconds: float = 8.0

    @classmethod
    def quick(cls) -> Settings:
        return cls(
            repeats=3,
            warmup=1,
            steps={"resnet18": 4, "small": 15, "tiny": 1},
            concurrency_repeats=2,
            concurrency_seconds=4.0,
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
            concurrency_repeats=1,
            concurrency_seconds=0.3,
            apply_length=20_000,
            apply_samples=2,
            rss_workers=2,
            rss_seconds=0.3,
        )

    @property
    def reference(self) -> str:
        return REFERENCE_MODEL if REFERENCE_MODEL in self.models else self.models[0]


# -- statistics ---------------------------------------------------------------------------


def summarize(values: Sequence[float]) -> Summary:
    """Median, quartiles, extremes and count of ``values``."""
    ordered = sorted(values)
    if not ordered:
        return {"median": math.nan, "q1": math.nan, "q3": math.nan, "min": math.nan, "max": math.nan, "n": 0}
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return {
        "median": statistics.median(ordered),
        "q1": q1,
        "q3": q3,
        "min": ordered[0],
        "max": ordered[-1],
        "n": len(ordered),
    }


def _scaled(summary: Summary, factor: float) -> Summary:
    return {key: value if key == "n" else value * factor for key, value in summary.items()}


# -- processes ------------------------------------------------------------------------------


def _child_environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    return env


def _read_line(process: subprocess.Popen[str], prefix: str, timeout_s: float = 60.0) -> str:
    """The first line of ``process``'s stdout that starts with ``prefix``."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.5)
        if ready:
            line = process.stdout.readline()
            if not line:
                break
            if line.startswith(prefix):
                return line.strip()
        elif process.poll() is not None:
            break
    process.kill()
    process.wait()
    raise RuntimeError(f"{process.args!r} did not print {prefix!r} within {timeout_s:.0f} s")


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, every thread) ``pid`` has used so far; clock-tick resolution."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # After the command name: field 14 (utime) and 15 (stime) of proc(5) are the 12th and 13th here.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_of(pids: Sequence[int]) -> float:
    return sum(cpu_seconds(pid) for pid in pids)


def vm_mb(pid: int, field_name: str) -> float:
    """A ``/proc/PID/status`` memory field (VmHWM, VmRSS) in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) * 1024 / 1e6
    return math.nan


@dataclass
class ServerProcess:
    label: str
    kind: str  # hetps, bare, peer
    process: subprocess.Popen[str]
    address: str
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


class Fleet:
    """Every server process of a run; stops them all on exit."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.servers: list[ServerProcess] = []

    def start_hetps(
        self,
        label: str,
        model: str,
        rule: str,
        rule_opts: Sequence[str],
        shard_index: int,
        num_shards: int,
        extra_args: Sequence[str] = (),
        environment: Mapping[str, str] | None = None,
    ) -> ServerProcess:
        shard_log = self.log_dir / label
        shard_log.mkdir(parents=True, exist_ok=True)
        process, address = start_server(
            shard_log,
            rule,
            LR,
            list(rule_opts),
            shard_index,
            num_shards,
            extra_args=[*SERVER_ARGS, *extra_args],
            environment=environment,
        )
        server = ServerProcess(label, "hetps", process, address, rule, tuple(rule_opts), model, shard_index, num_shards)
        server.rss_at_start_mb = vm_mb(server.pid, "VmRSS")
        self.servers.append(server)
        return server

    def start_module(self, label: str, kind: str, module: str, prefix: str) -> tuple[ServerProcess, str]:
        log = (self.log_dir / f"{label}.log").open("w")
        command = [sys.executable, "-m", module, "--torch-threads", str(TORCH_THREADS)]
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=log, text=True, cwd=REPO_ROOT, env=_child_environment()
        )
        line = _read_line(process, prefix)
        address = line.rsplit(" ", 1)[-1]
        server = ServerProcess(label, kind, process, address)
        server.rss_at_start_mb = vm_mb(server.pid, "VmRSS")
        self.servers.append(server)
        return server, line

    def checkpoint(self, phase: str) -> None:
        """Record every live server's peak RSS so far, as of the end of ``phase``."""
        for server in self.servers:
            if server.process.poll() is None:
                server.peak_rss_after[phase] = vm_mb(server.pid, "VmHWM")

    def stop(self) -> None:
        for server in self.servers:
            if server.kind == "hetps":
                stop_process(server.process)
            elif server.process.poll() is None:
                server.process.terminate()
                try:
                    server.process.wait(10)
                except subprocess.TimeoutExpired:
                    server.process.kill()
                    server.process.wait()


# -- the systems a worker step goes through -----------------------------------------------


class StepSystem(Protocol):
    def step(self, update: torch.Tensor, out: torch.Tensor) -> None: ...

    def close(self) -> None: ...


class HetpsStep:
    def __init__(self, addresses: list[str], layout: Layout, name: str, wire_dtype: str, flat: torch.Tensor) -> None:
        self.client = PSClient(addresses, layout, name=name, wire_dtype=wire_dtype)
        if not self.client.initialized:
            self.client.init(flat)
        self.client.pull(torch.empty_like(flat))

    def step(self, update: torch.Tensor, out: torch.Tensor) -> None:
        self.client.push(update, pull_into=out)

    def close(self) -> None:
        self.client.close()


class BareStep:
    def __init__(self, addresses: list[str], layout: Layout, key: str, wire_dtype: str, flat: torch.Tensor) -> None:
        self.client = _bare_grpc.BareClient(addresses, layout, key, wire_dtype, codec.DEFAULT_CHUNK_BYTES)
        self.client.init(flat)

    def step(self, update: torch.Tensor, out: torch.Tensor) -> None:
        self.client.step(update, out)

    def close(self) -> None:
        self.client.close()


class PeerStep:
    def __init__(self, key: str, flat: torch.Tensor) -> None:
        self.key = key
        rpc.rpc_sync(_torch_rpc_peer.SERVER_NAME, _torch_rpc_peer.init_params, args=(key, flat, LR))

    def step(self, update: torch.Tensor, out: torch.Tensor) -> None:
        params = rpc.rpc_sync(_torch_rpc_peer.SERVER_NAME, _torch_rpc_peer.push_and_pull, args=(self.key, update))
        out.copy_(params)  # into the worker's buffer, as hetps does

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class SystemSpec:
    name: str  # e.g. hetps-1shard-bf16
    kind: str  # hetps, bare, peer
    shards: int
    wire_dtype: str


def step_systems() -> list[SystemSpec]:
    specs = []
    for kind in ("hetps", "bare"):
        for shards in (1, 2):
            for dtype in ("fp32", "bf16"):
                specs.append(SystemSpec(f"{kind}-{shards}shard-{dtype}", kind, shards, dtype))
    specs.append(SystemSpec("peer-torch-rpc-fp32", "peer", 1, "fp32"))
    return specs


# -- section 1: steps -----------------------------------------------------------------------


def server_addresses(
    spec: SystemSpec, model: str, hetps: dict[str, dict[int, list[str]]], bare: list[str]
) -> list[str]:
    """The servers a system's step for ``model`` goes through (``["peer"]`` for the peer).

    hetps has servers per model and shard count; the bare service keeps a buffer per key on
    the same servers for every model; the peer is one process for all."""
    if spec.kind == "hetps":
        return hetps[model][spec.shards]
    if spec.kind == "bare":
        return bare[: spec.shards]
    return ["peer"]


def _time_steps(system: StepSystem, update: torch.Tensor, out: torch.Tensor, count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        system.step(update, out)
        samples.append(time.perf_counter() - started)
    return samples


def measure_steps(
    settings: Settings,
    hetps: dict[str, dict[int, list[str]]],
    bare: list[str],
    server_pids: dict[str, int],
    console: Console,
) -> dict[str, Any]:
    """Worker steps through every system, interleaved step by step.

    A repeat of a model is ``steps[model]`` rounds; a round is one step of every system, in
    an order rotated every round. All systems therefore sample the same moments of a shared,
    noisy machine, and a repeat's ratio compares medians taken over the same few seconds.

    Around every step (outside its timing) the CPU time of the system's server processes
    (``server_pids``: address, or ``"peer"``, to pid) and of this process (the client) is read:
    on a machine with fewer cores than busy threads the step's time follows the CPU both
    sides spend on it.
    """
    specs = step_systems()
    generator = torch.Generator().manual_seed(0)
    runs: list[tuple[str, SystemSpec, StepSystem, torch.Tensor, torch.Tensor]] = []
    per_repeat: dict[tuple[str, str], list[float]] = {}
    samples: dict[tuple[str, str], list[float]] = {}
    # (server seconds, client seconds) of CPU over every timed step, per (model, system)
    cpu: dict[tuple[str, str], list[float]] = {}
    pids_of: dict[tuple[str, str], list[int]] = {}
    try:
        for model in settings.models:
            shapes = MODELS[model]()
            length = Layout.from_named_shapes(shapes).total_length
            flat = torch.randn(length, generator=generator) * 0.01
            update = torch.randn(length, generator=generator) * 1e-4
            out = torch.empty(length)
            for spec in specs:
                layout = Layout.from_named_shapes(shapes, spec.shards)
                addresses = server_addresses(spec, model, hetps, bare)
                system: StepSystem
                if spec.kind == "hetps":
                    system = HetpsStep(addresses, layout, f"bench-{spec.name}", spec.wire_dtype, flat)
                elif spec.kind == "bare":
                    system = BareStep(addresses, layout, f"{model}-{spec.name}", spec.wire_dtype, flat)
                else:
                    system = PeerStep(model, flat)
                pids_of[(model, spec.name)] = [server_pids[address] for address in addresses]
                runs.append((model, spec, system, update, out))
                per_repeat[(model, spec.name)] = []
                samples[(model, spec.name)] = []
                cpu[(model, spec.name)] = [0.0, 0.0]
        for _, _, system, update, out in runs:
            _time_steps(system, update, out, settings.warmup)
        with console.status("steps") as status:
            for repeat in range(settings.repeats):
                for model in settings.models:
                    status.update(f"steps: {model}, repeat {repeat + 1}/{settings.repeats}")
                    mine = [run for run in runs if run[0] == model]
                    times: dict[str, list[float]] = {spec.name: [] for _, spec, _, _, _ in mine}
                    for round_index in range(settings.steps[model]):
                        shift = (repeat * settings.steps[model] + round_index) % len(mine)
                        for _, spec, system, update, out in mine[shift:] + mine[:shift]:
                            pids = pids_of[(model, spec.name)]
                            server_before, client_before = _cpu_of(pids), time.process_time()
                            times[spec.name] += _time_steps(system, update, out, 1)
                            used = cpu[(model, spec.name)]
                            used[0] += _cpu_of(pids) - server_before
                            used[1] += time.process_time() - client_before
                            if not bool(torch.isfinite(out).all()):
                                raise RuntimeError(f"{spec.name} returned non-finite parameters for {model}")
                    for name, taken in times.items():
                        per_repeat[(model, name)].append(statistics.median(taken))
                        samples[(model, name)].extend(taken)
    finally:
        for _, _, system, _, _ in runs:
            system.close()
    return _step_results(settings, specs, per_repeat, samples, cpu)


def _speed_ratio(
    first: list[float], other: list[float], first_samples: list[float], other_samples: list[float]
) -> dict[str, float]:
    """How much faster ``first`` is than ``other`` (their time / its time), per repeat and of the fastest steps."""
    return {
        **summarize([o / f for f, o in zip(first, other, strict=True)]),
        "of_fastest_steps": min(other_samples) / min(first_samples),
    }


def _step_results(
    settings: Settings,
    specs: list[SystemSpec],
    per_repeat: dict[tuple[str, str], list[float]],
    samples: dict[tuple[str, str], list[float]],
    cpu: dict[tuple[str, str], list[float]],
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for model in settings.models:
        length = Layout.from_named_shapes(MODELS[model]()).total_length
        systems: dict[str, Any] = {}
        for spec in specs:
            repeats = per_repeat[(model, spec.name)]
            wire_bytes = length * (4 if spec.wire_dtype == "fp32" else 2)
            median_s = statistics.median(repeats)
            taken = samples[(model, spec.name)]
            server_cpu, client_cpu = (seconds / len(taken) for seconds in cpu[(model, spec.name)])
            systems[spec.name] = {
                "kind": spec.kind,
                "shards": spec.shards,
                "wire_dtype": spec.wire_dtype,
                "wire_bytes_each_way": wire_bytes,
                "step_ms": _scaled(summarize(repeats), 1e3),
                "step_ms_all_samples": _scaled(summarize(samples[(model, spec.name)]), 1e3),
                "steps_per_s": 1.0 / median_s,
                "gb_per_s_each_way": wire_bytes / median_s / 1e9,
                "repeat_medians_ms": [t * 1e3 for t in repeats],
                # Means over every timed step: server processes (all shards) and the client process.
                "cpu_ms_per_step": {
                    "server": server_cpu * 1e3,
                    "client": client_cpu * 1e3,
                    "busy_cores": (server_cpu + client_cpu) / statistics.fmean(taken),
                },
            }
        pairs = [(spec.name, "peer-torch-rpc-fp32") for spec in specs if spec.kind == "hetps"]
        pairs += [(spec.name, spec.name.replace("hetps", "bare")) for spec in specs if spec.kind == "hetps"]
        # The ceiling against the peer: the most any server on this gRPC stack could reach.
        pairs += [(spec.name, "peer-torch-rpc-fp32") for spec in specs if spec.kind == "bare" and spec.shards == 1]
        ratios = {
            f"{first} vs {other}": _speed_ratio(
                per_repeat[(model, first)], per_repeat[(model, other)], samples[(model, first)], samples[(model, other)]
            )
            for first, other in pairs
        }
        results[model] = {"parameters": length, "systems": systems, "speed_ratios": ratios}
    return results


# -- section 2: concurrency (worker processes) ------------------------------------------------


@dataclass(frozen=True)
class PoolTarget:
    key: str
    model: str
    addresses: tuple[str, ...]
    workers: int  # only the first ``workers`` pool members join this target


def _pool_worker(
    index: int,
    targets: list[PoolTarget],
    commands: multiprocessing.queues.Queue[tuple[str, float, float] | None],
    results: multiprocessing.queues.Queue[tuple[str, int, dict[str, Any]]],
) -> None:
    """A worker process: joins its targets, then runs timed bursts of steps on command."""
    torch.set_num_threads(TORCH_THREADS)
    clients: dict[str, tuple[PSClient, torch.Tensor, torch.Tensor]] = {}
    # One update and one output per model, whatever the number of servers of that model.
    tensors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    try:
        generator = torch.Generator().manual_seed(1000 + index)
        for target in targets:
            if index >= target.workers:
                continue
            layout = Layout.from_named_shapes(MODELS[target.model](), len(target.addresses))
            if target.model not in tensors:
                length = layout.total_length
                tensors[target.model] = (torch.randn(length, generator=generator) * 1e-4, torch.empty(length))
            update, out = tensors[target.model]
            client = PSClient(list(target.addresses), layout, name=f"pool-{index}-{target.key}")
            client.pull(out)
            clients[target.key] = (client, update, out)
        results.put(("ready", index, {}))
        while True:
            command = commands.get()
            if command is None:
                break
            key, start_at, duration = command
            client, update, out = clients[key]
            while time.time() < start_at:
                time.sleep(min(0.005, max(0.0, start_at - time.time())))
            started = time.perf_counter()
            steps = errors = 0
            first_error = ""
            while time.perf_counter() - started < duration:
                try:
                    client.push(update, pull_into=out)
                    steps += 1
                except (grpc.RpcError, RuntimeError, ValueError) as error:
                    errors += 1
                    first_error = first_error or repr(error)
            elapsed = time.perf_counter() - started
            finite = bool(torch.isfinite(out).all())
            results.put(
                (
                    "done",
                    index,
                    {"steps": steps, "errors": errors, "elapsed": elapsed, "error": first_error, "finite": finite},
                )
            )
    except BaseException as error:  # reported to the parent, which fails the run
        results.put(("failed", index, {"error": repr(error)}))
    finally:
        for client, _, _ in clients.values():
            client.close()


class WorkerPool:
    """``size`` worker processes joined to every target, driven burst by burst."""

    def __init__(self, size: int, targets: list[PoolTarget]) -> None:
        context = multiprocessing.get_context("spawn")
        self.results: multiprocessing.queues.Queue[tuple[str, int, dict[str, Any]]] = context.Queue()
        self.commands: list[multiprocessing.queues.Queue[tuple[str, float, float] | None]] = []
        self.processes = []
        for index in range(size):
            inbox: multiprocessing.queues.Queue[tuple[str, float, float] | None] = context.Queue()
            process = context.Process(
                target=_pool_worker, args=(index, targets, inbox, self.results), name=f"pool-{index}", daemon=True
            )
            process.start()
            self.commands.append(inbox)
            self.processes.append(process)
        for _ in range(size):
            self._expect("ready", timeout_s=180.0)

    def _expect(self, kind: str, timeout_s: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                got, index, payload = self.results.get(timeout=1.0)
                break
            except queue.Empty:
                dead = [p.name for p in self.processes if p.exitcode is not None]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(f"pool workers {dead or 'all'} stopped answering (waiting for {kind})") from None
        if got != kind:
            raise RuntimeError(f"pool worker {index} {got}: {payload.get('error', payload)}")
        return payload

    @property
    def pids(self) -> list[int]:
        return [int(process.pid) for process in self.processes if process.pid is not None]

    def burst(self, key: str, workers: int, seconds: float) -> list[dict[str, Any]]:
        start_at = time.time() + 0.3
        for commands in self.commands[:workers]:
            commands.put((key, start_at, seconds))
        return [self._expect("done", timeout_s=seconds + 300.0) for _ in range(workers)]

    def close(self) -> None:
        for commands in self.commands:
            commands.put(None)
        for process in self.processes:
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join()


def measure_concurrency(
    settings: Settings, pool: WorkerPool, targets: list[PoolTarget], pids: dict[str, int], console: Console
) -> dict[str, Any]:
    """Bursts of 1, 4, 16 workers on each target, the order reversed every other repeat.

    An untimed warm-up burst per level (fewest workers first) goes before: the server's heap
    grows to its working size there, so first-touch page faults fall on no measured level, and
    the server's peak RSS read after each warm-up burst shows how memory grows with workers.
    """
    results: dict[str, Any] = {}
    peak_rss: dict[tuple[str, int], float] = {}
    raw: dict[tuple[str, int], list[float]] = {}
    errors: dict[tuple[str, int], int] = {}
    first_errors: dict[tuple[str, int], str] = {}
    finite: dict[tuple[str, int], bool] = {}
    latencies: dict[tuple[str, int], list[float]] = {}
    # Cores kept busy by the server and every pool process (idle ones included) per burst, and the
    # server's CPU per step: how far the machine, not hetps, bounds the aggregate.
    busy: dict[tuple[str, int], list[float]] = {}
    server_per_step: dict[tuple[str, int], list[float]] = {}
    with console.status("concurrency") as status:
        for target in targets:
            for workers in settings.concurrency:
                status.update(f"concurrency: warming up {target.model} with {workers} workers")
                pool.burst(target.key, workers, max(0.2, settings.concurrency_seconds / 4))
                peak_rss[(target.model, workers)] = vm_mb(pids[target.addresses[0]], "VmHWM")
        for repeat in range(settings.concurrency_repeats):
            for target in targets:
                order = settings.concurrency if repeat % 2 == 0 else tuple(reversed(settings.concurrency))
                for workers in order:
                    status.update(f"concurrency: {target.model}, {workers} workers, repeat {repeat + 1}")
                    server_before = cpu_seconds(pids[target.addresses[0]])
                    workers_before = _cpu_of(pool.pids)
                    started = time.perf_counter()
                    reports = pool.burst(target.key, workers, settings.concurrency_seconds)
                    wall = time.perf_counter() - started
                    key = (target.model, workers)
                    server_cpu = cpu_seconds(pids[target.addresses[0]]) - server_before
                    workers_cpu = _cpu_of(pool.pids) - workers_before
                    busy.setdefault(key, []).append((server_cpu + workers_cpu) / wall)
                    steps = sum(int(r["steps"]) for r in reports)
                    server_per_step.setdefault(key, []).append(server_cpu / max(1, steps))
                    raw.setdefault(key, []).append(sum(r["steps"] / r["elapsed"] for r in reports))
                    errors[key] = errors.get(key, 0) + sum(int(r["errors"]) for r in reports)
                    first_errors.setdefault(key, next((r["error"] for r in reports if r["error"]), ""))
                    finite[key] = finite.get(key, True) and all(bool(r["finite"]) for r in reports)
                    latencies.setdefault(key, []).extend(r["elapsed"] / r["steps"] for r in reports if r["steps"])
    for target in targets:
        single = raw[(target.model, settings.concurrency[0])]
        levels: dict[str, Any] = {}
        for workers in settings.concurrency:
            key = (target.model, workers)
            levels[str(workers)] = {
                "aggregate_steps_per_s": summarize(raw[key]),
                "vs_single_worker": summarize([a / s for a, s in zip(raw[key], single, strict=True)]),
                "seconds_per_step_per_worker": summarize(latencies[key]),
                "errors": errors[key],
                "first_error": first_errors[key],
                "parameters_finite": finite[key],
                "server_peak_rss_mb_after_warm_up": peak_rss[key],
                "cores_busy": summarize(busy[key]),
                "server_cpu_ms_per_step": _scaled(summarize(server_per_step[key]), 1e3),
            }
        results[target.model] = {"server": target.addresses[0], "rule": "asgd", "workers": levels}
    return results


# -- section 3: rule apply time -------------------------------------------------------------


def _rule_options(name: str) -> dict[str, str]:
    options = {"lr": str(LR)}
    if name == "gap-aware":
        options["momentum"] = "0.9"  # GA on top of momentum SGD, like the baseline it is compared with
    return options


def _constant(tensor: torch.Tensor) -> Callable[[], torch.Tensor]:
    return lambda: tensor


def measure_apply(settings: Settings, console: Console) -> dict[str, Any]:
    """Every rule's ``apply`` on one shard of ``apply_length`` against fused momentum SGD, interleaved."""
    length = settings.apply_length
    generator = torch.Generator().manual_seed(1)
    gradient = torch.randn(length, generator=generator) * 1e-3
    sgd_param = torch.nn.Parameter(torch.randn(length, generator=generator) * 0.01)
    sgd_param.grad = gradient.clone()
    fused = torch.optim.SGD([sgd_param], lr=LR, momentum=0.9, fused=True)
    foreach_param = torch.nn.Parameter(sgd_param.detach().clone())
    foreach_param.grad = gradient.clone()
    foreach = torch.optim.SGD([foreach_param], lr=LR, momentum=0.9, foreach=True)
    fused.step()
    foreach.step()

    def timed(fn: Callable[[], object]) -> float:
        started = time.perf_counter()
        fn()
        return time.perf_counter() - started

    baseline: dict[str, list[float]] = {"fused": [], "foreach": []}
    rules: dict[str, Any] = {}
    # Tensors cut like the reference model, so per-tensor rules see realistic segments.
    reference = Layout.from_named_shapes(MODELS[REFERENCE_MODEL]())
    segments = reference.segments(0) if reference.total_length == length else ((0, length),)
    with console.status("apply"):
        for name in sorted(RULES):
            rule_type = RULES[name]
            kind = PayloadKind.GRADIENT if PayloadKind.GRADIENT in rule_type.accepted_kinds else PayloadKind.DELTA
            options = _rule_options(name)
            entry: dict[str, Any] = {"kind": kind.name, "options": options}
            try:
                rule = RuleSpec.parse(name, options).build(length)
                params = torch.randn(length, generator=generator) * 0.01
                snapshot = params - torch.randn(length, generator=generator) * 1e-4
                update = torch.empty(length)
                ctx = PushContext(
                    worker_id=1,
                    staleness=2,
                    kind=kind,
                    segments=segments,
                    metadata={},
                    snapshot=_constant(snapshot),
                )
                apply = functools.partial(rule.apply, params, update, ctx)
                fused_times, rule_times = [], []
                for sample in range(settings.apply_samples + 1):
                    rule.on_pull(1)
                    update.copy_(gradient)  # decoding, not part of apply: the rule may overwrite it
                    fused_time = timed(fused.step)
                    rule_time = timed(apply)
                    baseline["foreach"].append(timed(foreach.step))
                    if sample:  # the first sample warms caches and lazy state
                        fused_times.append(fused_time)
                        rule_times.append(rule_time)
                baseline["fused"].extend(fused_times)
                entry.update(
                    {
                        "apply_ms": _scaled(summarize(rule_times), 1e3),
                        "fused_sgd_ms": _scaled(summarize(fused_times), 1e3),
                        "vs_fused_sgd": summarize([r / f for r, f in zip(rule_times, fused_times, strict=True)]),
                        "state_bytes": sum(t.numel() * t.element_size() for t in rule.state_tensors().values()),
                        "finite": bool(torch.isfinite(params).all()),
                    }
                )
                del rule, params, snapshot, update, apply
            except Exception as error:  # a rule that cannot run here is reported, not fatal
                entry["error"] = repr(error)
            rules[name] = entry
    return {
        "parameters": length,
        "torch_threads": torch.get_num_threads(),
        "baseline": "torch.optim.SGD(momentum=0.9, fused=True)",
        "fused_sgd_ms": _scaled(summarize(baseline["fused"]), 1e3),
        "foreach_sgd_ms": _scaled(summarize(baseline["foreach"]), 1e3),
        "rules": rules,
    }


# -- section 4: memory ----------------------------------------------------------------------


def _rule_state_bytes(rule: str, rule_opts: Sequence[str], length: int) -> tuple[int, bool]:
    options = {"lr": str(LR), **dict(opt.split("=", 1) for opt in rule_opts)}
    built = RuleSpec.parse(rule, options).build(length)
    state = sum(t.numel() * t.element_size() for t in built.state_tensors().values())
    return state, built.needs_snapshot


def measure_memory(fleet: Fleet) -> dict[str, Any]:
    servers: dict[str, Any] = {}
    order = {"hetps": 0, "bare": 1, "peer": 2}
    for server in sorted(fleet.servers, key=lambda s: (order[s.kind], s.label)):
        alive = server.process.poll() is None
        entry: dict[str, Any] = {
            "kind": server.kind,
            "pid": server.pid,
            "rss_at_start_mb": server.rss_at_start_mb,
            "peak_rss_mb_after": dict(server.peak_rss_after),
            "peak_rss_mb": vm_mb(server.pid, "VmHWM") if alive else math.nan,
        }
        if server.kind == "hetps":
            layout = Layout.from_named_shapes(MODELS[server.model](), server.num_shards)
            length = layout.shard(server.shard_index).length
            state, needs_snapshot = _rule_state_bytes(server.rule, server.rule_opts, length)
            params = length * 4
            snapshots = params * server.workers if needs_snapshot else 0
            must_hold_mb = (params + state + snapshots) / 1e6
            limit_mb = RSS_FACTOR * must_hold_mb + RSS_SLACK_MB
            entry.update(
                {
                    "model": server.model,
                    "rule": server.rule,
                    "rule_opts": list(server.rule_opts),
                    "shard": f"{server.shard_index + 1}/{server.num_shards}",
                    "max_concurrent_workers": server.workers,
                    "params_mb": params / 1e6,
                    "rule_state_mb": state / 1e6,
                    "snapshots_mb": snapshots / 1e6,
                    "must_hold_mb": must_hold_mb,
                    "limit_mb": limit_mb,
                    "peak_over_must_hold": entry["peak_rss_mb"] / must_hold_mb,
                }
            )
        servers[server.label] = entry
    return {"servers": servers, "rule": f"peak RSS <= {RSS_FACTOR} x must-hold + {RSS_SLACK_MB:.0f} MB"}


# -- targets --------------------------------------------------------------------------------


def _target(name: str, summary: Summary, threshold: float, at_least: bool, detail: str = "") -> dict[str, Any]:
    value = summary["median"]
    passed = value >= threshold if at_least else value <= threshold
    return {
        "target": name,
        "measured": value,
        "min": summary["min"],
        "max": summary["max"],
        "threshold": threshold,
        "comparison": ">=" if at_least else "<=",
        "pass": bool(passed),
        "detail": detail,
    }


def evaluate_targets(settings: Settings, results: dict[str, Any]) -> list[dict[str, Any]]:
    targets: list[dict[str, Any]] = []
    model = settings.reference
    ratios = results["steps"][model]["speed_ratios"]
    targets.append(
        _target(
            f"{model} step, 1 shard, fp32 vs torch.rpc peer",
            ratios["hetps-1shard-fp32 vs peer-torch-rpc-fp32"],
            PEER_FP32,
            True,
        )
    )
    targets.append(
        _target(
            f"{model} step, 1 shard, bf16 vs torch.rpc peer",
            ratios["hetps-1shard-bf16 vs peer-torch-rpc-fp32"],
            PEER_BF16,
            True,
        )
    )
    for name in settings.models:
        for key, summary in results["steps"][name]["speed_ratios"].items():
            if " vs bare-" in key:
                system = key.split(" vs ")[0].removeprefix("hetps-")
                targets.append(_target(f"{name} step {system} vs bare gRPC", summary, BARE_FRACTION, True))
    applies = results["apply"]["rules"]
    for rule, threshold in (("momentum", MOMENTUM_APPLY), ("gap-aware", GAP_AWARE_APPLY)):
        if rule in applies and "vs_fused_sgd" in applies[rule]:
            targets.append(
                _target(f"{rule} apply vs fused SGD (time)", applies[rule]["vs_fused_sgd"], threshold, False)
            )
    most = max(settings.concurrency)
    for name, data in results["concurrency"].items():
        level = data["workers"][str(most)]
        target = _target(f"{name}: {most} workers aggregate vs 1 worker", level["vs_single_worker"], 1.0, True)
        if level["errors"] or not level["parameters_finite"]:
            target["pass"] = False
        target["detail"] = f"errors={level['errors']}"
        targets.append(target)
    for label, server in results["memory"]["servers"].items():
        if server["kind"] != "hetps":
            continue
        peak = server["peak_rss_mb"]
        summary = {"median": peak, "min": peak, "max": peak, "q1": peak, "q3": peak, "n": 1}
        detail = f"must hold {server['must_hold_mb']:.0f} MB ({server['max_concurrent_workers']} workers)"
        targets.append(_target(f"peak RSS MB, {label}", summary, server["limit_mb"], False, detail))
    return targets


# -- tables -----------------------------------------------------------------------------------


def _spread(summary: Summary, digits: int = 1) -> str:
    return f"{summary['min']:.{digits}f}–{summary['max']:.{digits}f}"


def print_tables(results: dict[str, Any], console: Console) -> None:
    for model, data in results["steps"].items():
        table = Table(title=f"Worker step (push + pull), {model}: {data['parameters']:,} parameters")
        step_columns = (
            "system",
            "median ms",
            "IQR ms",
            "min–max ms",
            "steps/s",
            "GB/s each way",
            "server CPU ms",
            "client CPU ms",
            "cores busy",
        )
        for column in step_columns:
            table.add_column(column, justify="left" if column == "system" else "right")
        for name, system in data["systems"].items():
            step = system["step_ms"]
            used = system["cpu_ms_per_step"]
            table.add_row(
                name,
                f"{step['median']:.1f}" if step["median"] >= 1 else f"{step['median']:.3f}",
                f"{step['q1']:.1f}–{step['q3']:.1f}" if step["median"] >= 1 else f"{step['q1']:.3f}–{step['q3']:.3f}",
                _spread(step, 1 if step["median"] >= 1 else 3),
                f"{system['steps_per_s']:.1f}",
                f"{system['gb_per_s_each_way']:.3f}",
                f"{used['server']:.1f}",
                f"{used['client']:.1f}",
                f"{used['busy_cores']:.2f}",
            )
        console.print(table)
        ratios = Table(title=f"Speed ratios per repeat, {model}: A vs B = B's time / A's time (> 1: A is faster)")
        for column in ("pair", "median", "IQR", "min–max", "fastest steps"):
            ratios.add_column(column, justify="left" if column == "pair" else "right")
        for pair, summary in data["speed_ratios"].items():
            ratios.add_row(
                pair,
                f"{summary['median']:.2f}",
                f"{summary['q1']:.2f}–{summary['q3']:.2f}",
                _spread(summary, 2),
                f"{summary['of_fastest_steps']:.2f}",
            )
        console.print(ratios)
    for model, data in results["concurrency"].items():
        table = Table(title=f"Concurrent workers on one hetps shard (asgd, fp32), {model}")
        columns = (
            "workers",
            "aggregate steps/s",
            "min–max",
            "vs 1 worker",
            "s/step per worker",
            "errors",
            "server peak RSS MB",
            "server CPU ms/step",
            "cores busy",
        )
        for column in columns:
            table.add_column(column, justify="right")
        for workers, level in data["workers"].items():
            aggregate = level["aggregate_steps_per_s"]
            table.add_row(
                workers,
                f"{aggregate['median']:.1f}",
                _spread(aggregate),
                f"{level['vs_single_worker']['median']:.2f}",
                f"{level['seconds_per_step_per_worker']['median']:.3f}",
                str(level["errors"]),
                f"{level['server_peak_rss_mb_after_warm_up']:.0f}",
                f"{level['server_cpu_ms_per_step']['median']:.1f}",
                f"{level['cores_busy']['median']:.2f}",
            )
        console.print(table)
    apply = results["apply"]
    table = Table(
        title=f"Rule apply, {apply['parameters']:,} parameters, {apply['torch_threads']} torch thread(s); "
        f"fused SGD {apply['fused_sgd_ms']['median']:.1f} ms, foreach SGD {apply['foreach_sgd_ms']['median']:.1f} ms"
    )
    for column in ("rule", "push", "median ms", "min–max ms", "× fused SGD", "min–max ×"):
        table.add_column(column, justify="left" if column in ("rule", "push") else "right")
    for name, entry in apply["rules"].items():
        if "error" in entry:
            table.add_row(name, entry["kind"], "error", entry["error"][:40], "", "")
            continue
        table.add_row(
            name,
            entry["kind"],
            f"{entry['apply_ms']['median']:.1f}",
            _spread(entry["apply_ms"]),
            f"{entry['vs_fused_sgd']['median']:.2f}",
            _spread(entry["vs_fused_sgd"], 2),
        )
    console.print(table)
    table = Table(title="Peak server RSS (VmHWM) against what each server must hold")
    phases = ("steps", "workers joined", "concurrency")
    first = ("server", "rule", "workers", "must hold MB", "RSS at start MB")
    for column in (*first, *(f"peak after {phase}" for phase in phases), "peak RSS MB", "limit MB"):
        table.add_column(column, justify="left" if column in ("server", "rule") else "right")
    for label, server in results["memory"]["servers"].items():
        hetps = server["kind"] == "hetps"
        after = server["peak_rss_mb_after"]
        table.add_row(
            label,
            server.get("rule", server["kind"]),
            str(server.get("max_concurrent_workers", "")),
            f"{server['must_hold_mb']:.0f}" if hetps else "",
            f"{server['rss_at_start_mb']:.0f}",
            *(f"{after[phase]:.0f}" if phase in after else "" for phase in phases),
            f"{server['peak_rss_mb']:.0f}",
            f"{server['limit_mb']:.0f}" if hetps else "",
        )
    console.print(table)
    table = Table(title="Targets")
    for column in ("target", "measured (median)", "min–max", "target", "result"):
        table.add_column(column, justify="left" if column == "target" else "right")
    for target in results["targets"]:
        digits = 0 if target["target"].startswith("peak RSS") else 2
        table.add_row(
            target["target"] + (f" [{target['detail']}]" if target["detail"] else ""),
            f"{target['measured']:.{digits}f}",
            f"{target['min']:.{digits}f}–{target['max']:.{digits}f}",
            f"{target['comparison']} {target['threshold']:.{digits}f}",
            "[green]PASS[/green]" if target["pass"] else "[red]MISS[/red]",
        )
    console.print(table)


# -- the run ----------------------------------------------------------------------------------


def _start_servers(settings: Settings, fleet: Fleet) -> tuple[dict[str, dict[int, list[str]]], PoolTarget]:
    """hetps shards per model (1 and 2 shards, asgd) and the gap-aware server, started in parallel."""
    jobs: list[tuple[str, str, str, tuple[str, ...], int, int]] = []
    for model in settings.models:
        jobs.append((f"hetps-{model}-1shard", model, "asgd", (), 0, 1))
        jobs += [(f"hetps-{model}-2shard-{i}", model, "asgd", (), i, 2) for i in range(2)]
    gap_label = f"hetps-{settings.reference}-gap-aware"
    jobs.append((gap_label, settings.reference, "gap-aware", ("momentum=0.9",), 0, 1))
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        started = list(pool.map(lambda job: fleet.start_hetps(*job), jobs))
    by_label = {server.label: server for server in started}
    addresses: dict[str, dict[int, list[str]]] = {}
    for model in settings.models:
        addresses[model] = {
            1: [by_label[f"hetps-{model}-1shard"].address],
            2: [by_label[f"hetps-{model}-2shard-{i}"].address for i in range(2)],
        }
    gap = by_label[gap_label]
    return addresses, PoolTarget("gap-aware", gap.model, (gap.address,), settings.rss_workers)


def _initialize(model: str, addresses: list[str]) -> None:
    shapes = MODELS[model]()
    layout = Layout.from_named_shapes(shapes, len(addresses))
    client = PSClient(addresses, layout, name="bench-init")
    try:
        if not client.initialized:
            client.init(torch.randn(layout.total_length, generator=torch.Generator().manual_seed(0)) * 0.01)
    finally:
        client.close()


def run(settings: Settings, log_dir: Path, console: Console) -> dict[str, Any]:
    torch.set_num_threads(TORCH_THREADS)
    fleet = Fleet(log_dir)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "grpc": grpc.__version__,
            "malloc_tuning": {key: os.environ.get(key, "") for key in MALLOC_SETTINGS},
        },
        "settings": asdict(settings),
        "torch_threads_per_process": TORCH_THREADS,
        "chunk_bytes": codec.DEFAULT_CHUNK_BYTES,
    }
    peer_connected = False
    # First, while no server runs: the apply section is the most sensitive to memory bandwidth.
    results["apply"] = measure_apply(settings, console)
    try:
        with console.status("starting servers"):
            hetps, gap_target = _start_servers(settings, fleet)
            bare = [
                fleet.start_module(f"bare-grpc-{i}", "bare", "benchmarks._bare_grpc", "bare grpc listening")[0]
                for i in range(2)
            ]
            peer, line = fleet.start_module("peer-torch-rpc", "peer", "benchmarks._torch_rpc_peer", "peer rendezvous")
            _torch_rpc_peer.connect(int(line.rsplit(":", 1)[1]))
            peer_connected = True
        server_pids = {server.address: server.pid for server in fleet.servers} | {"peer": peer.pid}
        results["steps"] = measure_steps(settings, hetps, [b.address for b in bare], server_pids, console)
        fleet.checkpoint("steps")
        peer_peak = vm_mb(peer.pid, "VmHWM")
        rpc.shutdown()
        peer_connected = False
        _initialize(gap_target.model, list(gap_target.addresses))
        targets = [
            PoolTarget(model, model, tuple(hetps[model][1]), max(settings.concurrency)) for model in settings.models
        ]
        with console.status("starting worker processes"):
            pool = WorkerPool(max(*settings.concurrency, settings.rss_workers), [*targets, gap_target])
        fleet.checkpoint("workers joined")
        try:
            pids = {server.address: server.pid for server in fleet.servers}
            results["concurrency"] = measure_concurrency(settings, pool, targets, pids, console)
            fleet.checkpoint("concurrency")
            with console.status("gap-aware server under load"):
                reports = pool.burst("gap-aware", settings.rss_workers, settings.rss_seconds)
            results["gap_aware_load"] = {
                "workers": settings.rss_workers,
                "aggregate_steps_per_s": sum(r["steps"] / r["elapsed"] for r in reports),
                "errors": sum(int(r["errors"]) for r in reports),
            }
        finally:
            pool.close()
        loaded = {t.addresses[0]: t.workers for t in [*targets, gap_target]}
        for server in fleet.servers:
            # The most workers that pushed to a server at once (the step section's clients take turns).
            server.workers = loaded.get(server.address, 1)
        results["memory"] = measure_memory(fleet)
        results["memory"]["servers"]["peer-torch-rpc"]["peak_rss_mb"] = peer_peak
    finally:
        if peer_connected:
            rpc.shutdown(graceful=False)
        fleet.stop()
    results["targets"] = evaluate_targets(settings, results)
    results["wall_seconds"] = time.perf_counter() - started
    return results


def prepare_output(out: Path) -> tuple[Console, Path]:
    """A console for the tables, and the folder beside ``out`` where the servers' logs go."""
    console = Console()
    if not console.is_terminal:
        console = Console(width=180)  # tables in a log file or a pipe keep their columns
    out.parent.mkdir(parents=True, exist_ok=True)
    log_dir = out.parent / f"{out.stem}-logs"
    log_dir.mkdir(exist_ok=True)
    return console, log_dir


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats and shorter bursts (about 3 minutes)")
    parser.add_argument("--smoke", action="store_true", help="a tiny model and one step of everything (tests)")
    parser.add_argument("--repeats", type=int, default=None, help="repeats of the step section")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/throughput.json"))
    args = parser.parse_args(argv)
    settings = Settings.smoke() if args.smoke else Settings.quick() if args.quick else Settings()
    if args.repeats is not None:
        if args.repeats < 1:
            parser.error("--repeats must be at least 1")
        settings = replace(settings, repeats=args.repeats)
    console, log_dir = prepare_output(args.out)
    results = run(settings, log_dir, console)
    results["command"] = " ".join(["python -m benchmarks.throughput", *(argv if argv is not None else sys.argv[1:])])
    print_tables(results, console)
    args.out.write_text(json.dumps(results, indent=2))
    console.print(f"wrote {args.out} ({results['wall_seconds']:.0f} s)")
    return results


if __name__ == "__main__":
    apply_malloc_tuning()
    main()
