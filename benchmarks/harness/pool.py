"""Worker processes for concurrency measurements: each joins its targets, then runs timed bursts on command.

A :class:`WorkerPool` is started once (spawned processes, one torch thread each) and driven
burst by burst: every chosen worker starts at the same wall-clock moment, steps for the given
seconds and reports its steps, errors and whether its parameters stayed finite.

A worker is a ``PSClient`` with a preallocated update and output and no model. With
``per_process`` above one, that many workers share a process (each on its own thread and
connection) and its one update and one output per model, so 16 workers of a 124M-parameter
model cost the host a few GB rather than 16 × 1 GB: the server still sees each push and pull
whole, from a worker of its own.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.queues
import queue
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import grpc
import torch

from benchmarks.harness.models import MODELS
from benchmarks.harness.settings import TORCH_THREADS
from psproto.layout import Layout
from psworker.client import PSClient


@dataclass(frozen=True)
class PoolTarget:
    """Servers a pool drives under one key; only the first ``workers`` pool members join them."""

    key: str
    model: str
    addresses: tuple[str, ...]
    workers: int  # only the first ``workers`` pool members join this target


Joined = dict[tuple[str, int], tuple[PSClient, torch.Tensor, torch.Tensor]]


def _pool_worker(
    indices: range,
    targets: list[PoolTarget],
    commands: multiprocessing.queues.Queue[tuple[str, float, float, int] | None],
    results: multiprocessing.queues.Queue[tuple[str, int, dict[str, Any]]],
) -> None:
    """A process of pool members ``indices``: joins their targets, then runs timed bursts of steps on
    command (key, start, seconds, how many of its members step), each member on a thread."""
    torch.set_num_threads(TORCH_THREADS)
    clients: Joined = {}
    try:
        _join_targets(indices, targets, clients)
        for index in indices:
            results.put(("ready", index, {}))
        while True:
            command = commands.get()
            if command is None:
                break
            key, start_at, duration, count = command
            members = [clients[(key, index)] for index in indices[:count]]
            with ThreadPoolExecutor(max_workers=len(members)) as threads:
                bursts = [threads.submit(_burst, *member, start_at, duration) for member in members]
                reports = [burst.result() for burst in bursts]
            for index, report in zip(indices, reports, strict=False):
                results.put(("done", index, report))
    except BaseException as error:  # reported to the parent, which fails the run
        results.put(("failed", indices[0], {"error": repr(error)}))
    finally:
        for client, _, _ in clients.values():
            client.close()


def _join_targets(indices: range, targets: list[PoolTarget], clients: Joined) -> None:
    """Join pool members ``indices``' targets into ``clients`` ((key, member) -> client, update,
    output), so the caller closes those joined even when a later one fails."""
    # One update and one output per model, whatever the number of servers and members of that model.
    tensors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    generator = torch.Generator().manual_seed(1000 + indices[0])
    for target in targets:
        layout = Layout.from_named_shapes(MODELS[target.model](), len(target.addresses))
        for index in indices:
            if index >= target.workers:
                continue
            if target.model not in tensors:
                length = layout.total_length
                tensors[target.model] = (torch.randn(length, generator=generator) * 1e-4, torch.empty(length))
            update, out = tensors[target.model]
            client = PSClient(list(target.addresses), layout, name=f"pool-{index}-{target.key}")
            clients[(target.key, index)] = (client, update, out)
            client.pull(out)


def _burst(
    client: PSClient, update: torch.Tensor, out: torch.Tensor, start_at: float, duration: float
) -> dict[str, Any]:
    """Push and pull as fast as possible for ``duration`` seconds from wall time ``start_at``."""
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
    return {"steps": steps, "errors": errors, "elapsed": elapsed, "error": first_error, "finite": finite}


class WorkerPool:
    """``size`` workers joined to every target, ``per_process`` to a process, driven burst by burst."""

    def __init__(self, size: int, targets: list[PoolTarget], per_process: int = 1) -> None:
        context = multiprocessing.get_context("spawn")
        self.results: multiprocessing.queues.Queue[tuple[str, int, dict[str, Any]]] = context.Queue()
        self.commands: list[multiprocessing.queues.Queue[tuple[str, float, float, int] | None]] = []
        self.members: list[range] = [range(i, min(i + per_process, size)) for i in range(0, size, per_process)]
        self.processes = []
        for members in self.members:
            inbox: multiprocessing.queues.Queue[tuple[str, float, float, int] | None] = context.Queue()
            process = context.Process(
                target=_pool_worker,
                args=(members, targets, inbox, self.results),
                name=f"pool-{members[0]}",
                daemon=True,
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
        for commands, members in zip(self.commands, self.members, strict=True):
            count = len([index for index in members if index < workers])
            if count:
                commands.put((key, start_at, seconds, count))
        return [self._expect("done", timeout_s=seconds + 300.0) for _ in range(workers)]

    def close(self) -> None:
        for commands in self.commands:
            commands.put(None)
        for process in self.processes:
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join()
