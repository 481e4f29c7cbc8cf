"""One run of a time-to-accuracy race: N worker processes of set speeds train one task for a wall budget.

A hetps run starts a ``psserver serve`` process and N hetps workers; a DDP run starts N DDP
ranks. Every worker loads its data first and says it is ready; the race then starts them all
at once (time 0), records the parameters every few seconds, stops at the budget and scores the
snapshots afterwards (:mod:`experiments.harness.snapshots`).
"""

from __future__ import annotations

import multiprocessing
import queue
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from experiments.harness.link import Link, emulated_link
from experiments.harness.race_workers import DdpSettings, RaceWorker, ddp_rank, hetps_worker
from experiments.harness.snapshots import ParameterRecorder, Score, Snapshot, score, wall_clock_since
from pstools.launcher import start_server
from pstools.warm_start import stop_process
from psworker.task import Task

READY_TIMEOUT_S = 180.0
# DDP's momentum, the same as the hetps `momentum` rule's default.
DDP_MOMENTUM = 0.9


@dataclass(frozen=True)
class System:
    """What races: PyTorch DDP, or a hetps rule under a consistency model, at a learning rate."""

    name: str
    rule: str = "ddp"
    consistency: str = "async"
    options: tuple[str, ...] = ()
    # A pull grace of this many 1× step times (``pull_grace`` in seconds follows the race's step time).
    grace_steps: float = 0.0

    @property
    def is_ddp(self) -> bool:
        return self.rule == "ddp"

    def rule_options(self, step_seconds: float) -> tuple[str, ...]:
        """The server's ``--rule-opt`` values in a race whose 1× step lasts ``step_seconds``."""
        if self.grace_steps <= 0:
            return self.options
        return (*self.options, f"pull_grace={self.grace_steps * step_seconds:g}")


@dataclass(frozen=True)
class RaceSettings:
    task: str
    data_dir: Path | None
    step_seconds: float
    budget_seconds: float
    snapshot_seconds: float
    target: float
    # A shared link of this many Mbit/s for every process's traffic (experiments.harness.link);
    # None races over the bare loopback.
    link_mbit: float | None = None

    @property
    def link(self) -> Link | None:
        return None if self.link_mbit is None else Link(self.link_mbit)


@dataclass
class RunResult:
    system: str
    lr: float
    slowdowns: list[float]
    seed: int
    time_to_target: float | None
    accuracy_at_budget: float
    loss_at_budget: float
    samples_per_second: float
    diverged: bool
    workers: list[dict[str, Any]]
    curve: list[tuple[float, float]]
    # The race, from starting its processes to stopping them; of it, until all were ready. Scoring
    # the snapshots comes after (or beside the next race: experiments.harness.scoring).
    run_seconds: float
    setup_seconds: float = 0.0
    scoring_seconds: float = 0.0


def process_context() -> Any:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "psworker.train", "experiments.harness.race_workers"])
    return context


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank_of(body: Any) -> int:
    """The rank a message came from: "ready" carries the rank, "result" a dict with it."""
    return int(body["rank"]) if isinstance(body, dict) else int(body)


def _collect(messages: Any, kind: str, count: int, processes: list[Any], timeout: float) -> list[Any]:
    """``count`` messages of ``kind`` ("ready" or "result"); a worker's error or death raises instead."""
    received: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(received) < count:
        try:
            what, body = messages.get(timeout=1.0)
        except queue.Empty:
            # A worker that sent its message and ended (e.g. a diverged run stops early) is fine;
            # one that died, or ended without its message, would leave this wait hanging.
            reported = {_rank_of(body) for body in received}
            ended = [
                rank
                for rank, p in enumerate(processes)
                if p.exitcode is not None and (p.exitcode != 0 or rank not in reported)
            ]
            if ended or time.monotonic() > deadline:
                codes = [p.exitcode for p in processes]
                raise RuntimeError(f"race workers did not report {kind} (exit codes {codes})") from None
            continue
        if what == "error":
            raise RuntimeError(f"race worker {body['rank']} failed:\n{body['error']}")
        if what != kind:
            raise RuntimeError(f"race worker sent {what!r} while the race waited for {kind!r}")
        received.append(body)
    return received


@dataclass
class Race:
    """A race before scoring: what its workers reported and the parameters it recorded."""

    system: str
    lr: float
    slowdowns: list[float]
    seed: int
    reports: list[dict[str, Any]]
    snapshots: list[Snapshot]
    run_seconds: float
    setup_seconds: float


def run_once(
    system: System, lr: float, slowdowns: list[float], seed: int, settings: RaceSettings, task: Task, log_dir: Path
) -> RunResult:
    """One race of ``system`` at ``lr``, scored before returning; ``task`` is the whole task."""
    raced = race_once(system, lr, slowdowns, seed, settings, task, log_dir)
    scoring_started = time.monotonic()
    scored = score(task, raced.snapshots, settings.target)
    return scored_run(raced, scored, time.monotonic() - scoring_started, settings)


def race_once(
    system: System, lr: float, slowdowns: list[float], seed: int, settings: RaceSettings, task: Task, log_dir: Path
) -> Race:
    """One race of ``system`` at ``lr``, unscored (``task`` builds the recorder's model)."""
    context = process_context()
    messages = context.Queue()
    start = context.Event()
    started_at = context.Value("d", 0.0)
    specs = [
        RaceWorker(
            rank,
            len(slowdowns),
            settings.task,
            settings.data_dir,
            seed,
            slowdown,
            settings.step_seconds,
            settings.budget_seconds,
        )
        for rank, slowdown in enumerate(slowdowns)
    ]
    began = time.monotonic()
    log_dir.mkdir(parents=True, exist_ok=True)
    server = None
    recorder: ParameterRecorder | None = None
    processes: list[Any] = []
    snapshot_file = log_dir / f"ddp-{seed}-snapshots.pt"
    with emulated_link(settings.link):
        try:
            if system.is_ddp:
                ddp = DdpSettings(
                    f"127.0.0.1:{_free_port()}", lr, DDP_MOMENTUM, settings.snapshot_seconds, snapshot_file
                )
                processes = [
                    context.Process(target=ddp_rank, args=(spec, ddp, start, started_at, messages)) for spec in specs
                ]
            else:
                extra = ["--consistency", system.consistency]
                options = system.rule_options(settings.step_seconds)
                server, address = start_server(log_dir, system.rule, lr, options, extra_args=extra)
                processes = [
                    context.Process(target=hetps_worker, args=(spec, [address], start, messages)) for spec in specs
                ]
                recorder = ParameterRecorder([address], task, settings.snapshot_seconds)
            for process in processes:
                process.start()
            _collect(messages, "ready", len(specs), processes, READY_TIMEOUT_S)
            t0 = time.time()
            setup_seconds = time.monotonic() - began
            started_at.value = t0
            start.set()
            if recorder is not None:
                recorder.start(wall_clock_since(t0))
            reports = _collect(messages, "result", len(specs), processes, settings.budget_seconds + READY_TIMEOUT_S)
            snapshots = _recorded(recorder, snapshot_file)
            recorder = None
            for process in processes:
                process.join(30)
        finally:
            for process in processes:
                if process.is_alive():
                    process.kill()
                    process.join()
            if recorder is not None:
                recorder.client.close()
            if server is not None:
                stop_process(server)
    reports.sort(key=lambda r: r["rank"])
    return Race(system.name, lr, slowdowns, seed, reports, snapshots, time.monotonic() - began, setup_seconds)


def _recorded(recorder: ParameterRecorder | None, snapshot_file: Path) -> list[Snapshot]:
    """The race's snapshots: the recorder's (stopped now), or those DDP's rank 0 saved to ``snapshot_file``."""
    if recorder is not None:
        recorder.stop()
        return recorder.snapshots
    snapshots: list[Snapshot] = torch.load(snapshot_file)
    snapshot_file.unlink()
    return snapshots


def scored_run(raced: Race, scored: Score, scoring_seconds: float, settings: RaceSettings) -> RunResult:
    """The result of ``raced`` once its snapshots are scored."""
    reports = raced.reports
    samples = sum(int(r["steps"]) * int(r["batch_size"]) for r in reports)
    workers = [
        {
            "rank": r["rank"],
            "slowdown": raced.slowdowns[r["rank"]],
            "steps": r["steps"],
            "pushes": r["pushes"],
            "mean_staleness": r["mean_staleness"],
            "max_staleness": r["max_staleness"],
            "overrun_steps": r["overrun_steps"],
        }
        for r in reports
    ]
    return RunResult(
        raced.system,
        raced.lr,
        raced.slowdowns,
        raced.seed,
        scored.time_to_target,
        scored.accuracy_at_budget,
        scored.loss_at_budget,
        samples / settings.budget_seconds,
        scored.diverged or any(r.get("diverged", False) for r in reports),
        workers,
        scored.curve,
        raced.run_seconds,
        raced.setup_seconds,
        scoring_seconds,
    )
