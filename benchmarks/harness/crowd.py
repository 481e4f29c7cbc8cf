"""Many workers in a few processes: each worker a thread with its own PSClient (its own connection,
name and heartbeats), driven level by level.

Hundreds of worker processes do not fit on a small host, and what a worker costs a server is its
connection and its calls, not its process. A :class:`Crowd` starts its processes once; for each
level, :meth:`Crowd.begin` has them join their share of the workers (``psworker.client.PSClient``
each, on a channel of its own: gRPC's local subchannel pool gives it its own TCP connection), then
every worker pushes and pulls from the same wall-clock moment for the given seconds, heartbeats
every ``HEARTBEAT_S`` as ``psworker train`` does, and leaves as soon as its time is up, so a
bulk-synchronous round it is no longer in closes without it. A worker still inside a call
``GRACE_S`` after the end is cut off (its channel closed) and counted as stuck: a server that
stalls shows in the report instead of hanging the benchmark.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.queues
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from psproto.layout import Layout
from psworker.client import ClientConfig, PSClient

HEARTBEAT_S = 5.0  # psworker train's default heartbeat interval
GRACE_S = 10.0  # how long a call may run past the end of a level before its worker is cut off
JOIN_TIMEOUT_S = 30.0
START_TIMEOUT_S = 300.0
Command = tuple[str, dict[str, Any]] | None
SUMMED = ("workers", "pushes_in_window", "acknowledged", "workers_that_pushed", "errors", "stuck", "heartbeat_errors")


class _Worker:
    """One worker of the crowd: a joined client, its output buffer and what it counted."""

    def __init__(self, client: PSClient, out: torch.Tensor) -> None:
        self.client, self.out = client, out
        self.in_window = self.acknowledged = self.errors = 0
        self.first_error = ""
        self.done = threading.Event()

    def run(self, update: torch.Tensor, start_at: float, end_at: float) -> None:
        time.sleep(max(0.0, start_at - time.time()))
        try:
            while time.time() < end_at:
                try:
                    self.client.push(update, pull_into=self.out)
                except Exception as error:  # counted: a refused or failed call is data here
                    self.errors += 1
                    self.first_error = self.first_error or repr(error)
                    time.sleep(0.05)
                    continue
                self.acknowledged += 1
                self.in_window += time.time() <= end_at
        finally:
            with contextlib.suppress(ValueError):  # cut off at the end: its channel is closed already
                self.client.close()
            self.done.set()


def _join(process: int, spec: dict[str, Any]) -> tuple[list[_Worker], int, str]:
    """Join this process's ``count`` workers to ``addresses`` (threads at once); the workers, the
    joins that failed and the first failure."""
    layout = Layout.from_named_shapes(spec["shapes"], len(spec["addresses"]))
    config = ClientConfig(connect_timeout=JOIN_TIMEOUT_S)

    def join(index: int) -> _Worker:
        name = f"crowd-{spec['tag']}-{process}-{index}"
        client = PSClient(list(spec["addresses"]), layout, name=name, config=config)
        out = torch.empty(layout.total_length)
        try:
            client.pull(out)
        except BaseException:
            client.close()
            raise
        return _Worker(client, out)

    workers, failed, first = [], 0, ""
    with ThreadPoolExecutor(max_workers=16) as pool:
        for future in [pool.submit(join, index) for index in range(spec["count"])]:
            try:
                workers.append(future.result())
            except Exception as error:
                failed += 1
                first = first or repr(error)
    return workers, failed, first


def _run(workers: list[_Worker], update: torch.Tensor, start_at: float, seconds: float) -> dict[str, Any]:
    """Every worker pushes from ``start_at`` for ``seconds``; what they did, summed."""
    end_at = start_at + seconds
    threads = [threading.Thread(target=w.run, args=(update, start_at, end_at), daemon=True) for w in workers]
    for thread in threads:
        thread.start()
    stop = threading.Event()
    heartbeat_errors = [0]

    def beat() -> None:
        while not stop.wait(HEARTBEAT_S):
            for worker in workers:
                if not worker.done.is_set():
                    try:
                        worker.client.heartbeat({})
                    except Exception:  # a worker leaving, or a server that stopped answering
                        heartbeat_errors[0] += 1

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    for thread in threads:
        thread.join(max(0.0, end_at + GRACE_S - time.time()))
    stuck = [w for w in workers if not w.done.is_set()]
    for worker in stuck:
        worker.client.close(leave=False)  # cancels the call it is stuck in
    stop.set()
    return {
        "workers": len(workers),
        "pushes_in_window": sum(w.in_window for w in workers),
        "acknowledged": sum(w.acknowledged for w in workers),
        "workers_that_pushed": sum(w.acknowledged > 0 for w in workers),
        "errors": sum(w.errors for w in workers),
        "first_error": next((w.first_error for w in workers if w.first_error), ""),
        "stuck": len(stuck),
        "heartbeat_errors": heartbeat_errors[0],
        "finite": all(bool(torch.isfinite(w.out).all()) for w in workers),
    }


def _crowd_process(
    process: int,
    inbox: multiprocessing.queues.Queue[Command],
    outbox: multiprocessing.queues.Queue[tuple[str, int, dict[str, Any]]],
) -> None:
    """A load process: joins its share on ``join``, runs it on ``run``, until None."""
    torch.set_num_threads(1)
    workers: list[_Worker] = []
    update = torch.empty(0)
    outbox.put(("ready", process, {}))
    while (command := inbox.get()) is not None:
        kind, spec = command
        try:
            if kind == "join":
                workers, failed, first = _join(process, spec)
                length = Layout.from_named_shapes(spec["shapes"], len(spec["addresses"])).total_length
                update = torch.randn(length, generator=torch.Generator().manual_seed(process)) * 1e-4
                outbox.put(("joined", process, {"join_failures": failed, "join_error": first}))
            else:
                outbox.put(("done", process, _run(workers, update, spec["start_at"], spec["seconds"])))
                workers = []
        except BaseException as error:  # reported to the parent, which fails the run
            outbox.put(("failed", process, {"error": repr(error)}))


def shares(workers: int, processes: int) -> list[int]:
    """``workers`` dealt over ``processes`` as evenly as possible (the first ones get the extra)."""
    return [workers // processes + (index < workers % processes) for index in range(processes)]


class Crowd:
    """``processes`` load processes, driven level by level with :meth:`begin` and :meth:`end`."""

    def __init__(self, processes: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.outbox: multiprocessing.queues.Queue[tuple[str, int, dict[str, Any]]] = context.Queue()
        self.inboxes: list[multiprocessing.queues.Queue[Command]] = [context.Queue() for _ in range(processes)]
        self.processes = [
            context.Process(target=_crowd_process, args=(i, inbox, self.outbox), name=f"crowd-{i}", daemon=True)
            for i, inbox in enumerate(self.inboxes)
        ]
        for process in self.processes:
            process.start()
        # A spawned process imports torch and gRPC first: on a busy host that alone takes a minute.
        self._collect("ready", processes, START_TIMEOUT_S)
        self._dealt: list[tuple[multiprocessing.queues.Queue[Command], int]] = []
        self._joined: list[dict[str, Any]] = []
        self._seconds = 0.0

    @property
    def pids(self) -> list[int]:
        return [int(p.pid) for p in self.processes if p.pid is not None]

    def _collect(self, kind: str, count: int, timeout_s: float) -> list[dict[str, Any]]:
        deadline, got = time.monotonic() + timeout_s, list[dict[str, Any]]()
        while len(got) < count:
            try:
                answer, index, payload = self.outbox.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise RuntimeError(f"crowd processes gave {len(got)} of {count} '{kind}' answers in time") from None
            if answer != kind:
                raise RuntimeError(f"crowd process {index} {answer}: {payload.get('error', payload)}")
            got.append(payload)
        return got

    def begin(
        self, addresses: Sequence[str], shapes: list[tuple[str, tuple[int, ...]]], workers: int, seconds: float
    ) -> float:
        """Join ``workers`` workers and set them pushing for ``seconds``; the wall-clock moment
        (``time.time()``) they start, once all have joined. :meth:`end` collects their report."""
        self._dealt = [
            (inbox, n) for inbox, n in zip(self.inboxes, shares(workers, len(self.inboxes)), strict=True) if n
        ]
        tag = f"{workers}-{time.monotonic_ns() % 10**6}"
        for inbox, count in self._dealt:
            inbox.put(("join", {"addresses": list(addresses), "shapes": shapes, "count": count, "tag": tag}))
        self._joined = self._collect("joined", len(self._dealt), 60.0 + workers * 0.25)
        self._seconds = seconds
        start_at = time.time() + 0.5
        for inbox, _ in self._dealt:
            inbox.put(("run", {"start_at": start_at, "seconds": seconds}))
        return start_at

    def end(self) -> dict[str, Any]:
        """What the workers set going by :meth:`begin` did, summed over the processes."""
        reports = self._collect("done", len(self._dealt), self._seconds + GRACE_S + 60.0)
        total: dict[str, Any] = {key: sum(r[key] for r in reports) for key in SUMMED}
        total["join_failures"] = sum(j["join_failures"] for j in self._joined)
        errors = [*(j["join_error"] for j in self._joined), *(r["first_error"] for r in reports)]
        total["first_error"] = next((error for error in errors if error), "")
        total["finite"] = all(r["finite"] for r in reports)
        return total

    def close(self) -> None:
        for inbox in self.inboxes:
            inbox.put(None)
        for process in self.processes:
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join()
