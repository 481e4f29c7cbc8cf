"""A heterogeneous cluster in one process, in virtual time, through the real shard and procedures.

Every update goes through a real :class:`psserver.core.shard.Shard` (the server's rules,
staleness, snapshots and consistency) and every worker starts as a real worker does
(:func:`psworker.startup.start_worker`) and runs the real worker procedure the rule asks for,
talking to the shard through :class:`pstools.inprocess.InProcessService`. Nothing sleeps and nothing
crosses a network: an event queue orders the workers' steps by virtual time.

- A worker computes its gradient on the parameters it last pulled; finishing a step at
  virtual time ``t`` runs its procedure there (push, and pull for the next step), then it
  starts the next step, which takes a time drawn from its :class:`SpeedModel`.
- Ties in time go to the lower rank, so equal speeds are round-robin (``τ = n − 1``).
- ``delay=D`` (constant delay, as in the Adaptive Braking paper): ``D + 1`` workers of equal
  speed in round-robin, the first ``D`` of which push one zero gradient first, so every
  real gradient computed at clock ``c`` is applied at clock ``c + D`` (a FIFO of ``D``).
- SSP: a worker whose pull the shard would hold (``ssp_must_wait``) is parked and pulls
  again, with the shard's own pull, once a push by another worker releases it.
- BSP: each worker runs its steps up to its next push (one step, or a window of local steps:
  synchronous DiLoCo is ``diloco`` under BSP); the round takes the slowest worker's time, and
  the pushes go through the shard's BSP barrier (each non-last push waits on a helper thread,
  started in rank order).
- A hold the rule puts on a worker's pull after its push (``Shard.pull_hold_pending``): the worker
  is parked like an SSP one; it pulls once every push of that virtual instant is applied and the
  shard no longer holds it (``Shard.pull_hold``), or when the hold runs out.
- Windows of local steps the rule assigns: the shard measures each worker's local steps per
  virtual second from its pushes, and the real procedure follows the window each push reply
  assigns.

Every evaluation measures the test accuracy and loss; the task's metric (accuracy, higher is
better, or a language model's validation loss, lower is better) decides when a target is reached.

Everything is deterministic for a seed: batches, step times and the order of events.
"""

from __future__ import annotations

import heapq
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from psproto import codec
from psserver.core.consistency import Consistency, ConsistencyModel, ssp_must_wait
from psserver.core.errors import ErrorKind, ShardError
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from pstools.inprocess import InProcessService
from pstools.sim_config import (
    CurvePoint,
    SimConfig,
    SimResult,
    SimulationError,
    SpeedModel,
    WorkerStats,
    load_profile,
)
from pstools.sim_tasks import sim_task
from psworker.binding import ModelBinding
from psworker.procedures import Procedure, StepOutcome
from psworker.push_encoding import PushEncoder
from psworker.startup import start_worker
from psworker.task import Task, evaluate

__all__ = [
    "CurvePoint",
    "SimConfig",
    "SimResult",
    "Simulation",
    "SimulationError",
    "SpeedModel",
    "WorkerStats",
    "load_profile",
    "simulate",
]

# Leases and exclusive pulls are counted in virtual seconds; nothing in a simulation expires.
_NEVER_S = 1e18


# -- the simulation ---------------------------------------------------------------------------


@dataclass
class _Worker:
    rank: int
    model: torch.nn.Module
    binding: ModelBinding
    client: InProcessService
    procedure: Procedure[Any]
    batches: torch.Generator
    duration: Callable[[], float]
    stats: WorkerStats
    parked_at: float = 0.0


class _DivergedError(Exception):
    pass


class Simulation:
    """One run of :class:`SimConfig`; :meth:`run` returns a :class:`SimResult`."""

    def __init__(self, config: SimConfig, task: Task | None = None) -> None:
        self.config = config
        self._validate()
        self.task = task or sim_task(config.task, Path(config.data_dir) if config.data_dir else None)
        consistency = Consistency(ConsistencyModel(config.consistency), config.ssp_bound)
        spec = RuleSpec.parse(config.rule, dict(config.options))
        try:
            shard_config = ShardConfig(
                spec, lease_seconds=_NEVER_S, consistency=consistency, exclusive_pull_seconds=_NEVER_S
            )
        except ValueError as error:  # the rule's scheduling cannot run under this consistency
            raise SimulationError(str(error)) from None
        self.now = 0.0
        self.shard = Shard(shard_config, clock_source=lambda: self.now)
        self.rng = random.Random(config.seed)
        # Workers whose parked pull is being made now (``_release``): not parked again.
        self._resuming: set[int] = set()
        count = config.delay + 1 if config.delay is not None else config.workers
        speeds = SpeedModel("constant", step_s=config.speeds.step_s) if config.delay is not None else config.speeds
        self.workers = [self._make_worker(rank, speeds) for rank in range(count)]
        if self.workers[0].procedure.name in {"easgd", "gem"} and config.consistency == "bsp":
            raise SimulationError("BSP is simulated for the gradient, delta, agn and diloco procedures")
        if self.workers[0].procedure.name not in {"gradient", "delta", "agn"} and config.consistency == "ssp":
            raise SimulationError("SSP is simulated for the gradient, delta and agn procedures")
        if self.workers[0].procedure.name != "gradient" and config.delay is not None:
            raise SimulationError("constant-delay mode needs a rule whose worker procedure is 'gradient'")
        self.eval_model = self.task.build_model()
        self.eval_binding = ModelBinding(self.eval_model)
        self.steps = 0
        self.curve: list[CurvePoint] = []
        self.pushes: list[tuple[float, int, int]] = []
        self.histogram: Counter[int] = Counter()
        self.telemetry_sum: dict[str, float] = {}
        self.telemetry_count: dict[str, int] = {}
        self.recent_losses: list[float] = []
        self.time_to_target: float | None = None
        self.steps_to_target: int | None = None
        self.next_eval = config.eval_every

    def _validate(self) -> None:
        c = self.config
        if c.consistency not in {"async", "ssp", "bsp"}:
            raise SimulationError(f"consistency {c.consistency!r} is not async, ssp or bsp")
        if c.workers < 1 or c.steps < 1 or c.eval_every < 1:
            raise SimulationError("workers, steps and eval_every must be >= 1")
        if c.push_dtype not in codec.PUSH_DTYPE_NAMES:
            raise SimulationError(f"push dtype {c.push_dtype!r} is not one of {', '.join(codec.PUSH_DTYPE_NAMES)}")
        if c.delay is not None and (c.delay < 0 or c.consistency != "async"):
            raise SimulationError("the constant delay must be >= 0 and runs asynchronously")

    def _make_worker(self, rank: int, speeds: SpeedModel) -> _Worker:
        model = self.task.build_model()
        binding = ModelBinding(model)
        push_dtype = codec.PUSH_DTYPE_NAMES[self.config.push_dtype]
        encoder = None if push_dtype == codec.FLOAT32 else PushEncoder(push_dtype, self.config.error_feedback)
        client = InProcessService(
            self.shard,
            binding.layout,
            f"sim-{rank}",
            device="sim",
            hold_pull=self._hold_pull,
            push_encoder=encoder,
        )
        procedure = start_worker(client, binding, build_optimizer=self.task.build_optimizer)
        batches = torch.Generator().manual_seed(self.config.seed * 1000 + rank)
        duration = speeds.sampler(rank, random.Random(self.rng.getrandbits(64)))
        return _Worker(
            rank, model, binding, client, procedure, batches, duration, WorkerStats(rank, speeds.slowdown(rank))
        )

    def _hold_pull(self, worker_id: int) -> bool:
        """Whether a worker's pull must wait now: it is parked, and resumes when ``_may_resume``.

        A push that puts a hold on its worker's pull always parks the worker, so that every push of
        the same instant is applied before any of their pulls (they land together, the hold's very
        case); it resumes at the instant's end, or later while the shard still holds it."""
        if worker_id not in self._resuming and self.shard.pull_hold_pending(worker_id):
            return True
        return self._ssp_holds(worker_id)

    def _may_resume(self, worker_id: int) -> bool:
        return self.shard.pull_hold(worker_id) is None and not self._ssp_holds(worker_id)

    def _ssp_holds(self, worker_id: int) -> bool:
        if self.config.consistency != "ssp":
            return False
        live = self.shard.workers
        return ssp_must_wait(live[worker_id].ssp_clock, (w.ssp_clock for w in live.values()), self.config.ssp_bound)

    # -- one step -------------------------------------------------------------------------

    def _compute(self, worker: _Worker, pad: bool = False) -> float:
        """Forward and backward on the worker's parameters; a pad leaves a zero gradient."""
        worker.model.zero_grad(set_to_none=False)
        if pad:
            for parameter in worker.model.parameters():
                if parameter.grad is not None:
                    parameter.grad.zero_()
            return float("nan")
        task = self.task
        index = torch.randint(0, task.train_size, (task.batch_size,), generator=worker.batches)
        loss = task.loss(worker.model(task.train_inputs[index]), task.train_targets[index])
        loss.backward()  # type: ignore[no-untyped-call]
        value = float(loss.detach())
        if not math.isfinite(value):
            raise _DivergedError
        return value

    def _step(self, worker: _Worker, pad: bool = False) -> StepOutcome:
        loss = self._compute(worker, pad)
        try:
            outcome = worker.procedure.step(loss)
        except ShardError as error:
            if error.kind is ErrorKind.NON_FINITE:
                raise _DivergedError from None
            raise
        if not pad:
            self._count_step(worker, loss)
        if outcome.pushed and not pad:
            self._record_push(worker, outcome)
        return outcome

    def _count_step(self, worker: _Worker, loss: float) -> None:
        self.steps += 1
        worker.stats.steps += 1
        self.recent_losses.append(loss)
        del self.recent_losses[: -4 * len(self.workers)]

    def _record_push(self, worker: _Worker, outcome: StepOutcome) -> None:
        tau = outcome.staleness
        worker.stats.pushes += 1
        worker.stats.staleness_sum += tau
        worker.stats.max_staleness = max(worker.stats.max_staleness, tau)
        self.histogram[tau] += 1
        if self.config.record_pushes:
            self.pushes.append((self.now, worker.rank, tau))
        worker.stats.steps_pushed = worker.stats.steps
        worker.stats.local_steps = int(outcome.telemetry.get("local_steps", 0.0))
        for key, value in outcome.telemetry.items():
            if key != "staleness" and math.isfinite(value):
                self.telemetry_sum[key] = self.telemetry_sum.get(key, 0.0) + value
                self.telemetry_count[key] = self.telemetry_count.get(key, 0) + 1

    def _maybe_evaluate(self) -> None:
        if self.steps >= self.next_eval:
            self._evaluate()
            while self.next_eval <= self.steps:
                self.next_eval += self.config.eval_every

    def _evaluate(self) -> CurvePoint:
        self.eval_binding.params.copy_(self.shard.params)
        self.eval_binding.scatter_params()
        accuracy, loss = evaluate(self.eval_model, self.task, torch.device("cpu"))
        recent = self.recent_losses
        point = CurvePoint(
            self.now,
            self.shard.clock,
            self.steps,
            self.steps * self.task.batch_size,
            accuracy,
            loss,
            sum(recent) / len(recent) if recent else float("nan"),
        )
        if not self.curve or self.curve[-1].steps != point.steps:
            self.curve.append(point)
        target = self.config.target
        metric = self.task.metric
        if target is not None and self.time_to_target is None and metric.reached(metric.of(accuracy, loss), target):
            self.time_to_target = self.now
            self.steps_to_target = self.steps
        return point

    def _done(self) -> bool:
        c = self.config
        if self.steps >= c.steps:
            return True
        if c.max_updates is not None and self.shard.clock >= c.max_updates:
            return True
        return c.stop_at_target and self.time_to_target is not None

    # -- the event loops ------------------------------------------------------------------

    def run(self) -> SimResult:
        started = time.perf_counter()
        diverged = False
        try:
            if self.config.consistency == "bsp":
                self._run_bsp()
            else:
                self._run_async()
        except _DivergedError:
            diverged = True
        final = self._evaluate()
        metric = self.task.metric
        return SimResult(
            config=self.config.describe(),
            curve=self.curve,
            workers=[w.stats for w in self.workers],
            staleness_histogram=dict(self.histogram),
            telemetry={k: self.telemetry_sum[k] / self.telemetry_count[k] for k in sorted(self.telemetry_sum)},
            pushes=self.pushes,
            test_accuracy=0.0 if diverged else final.test_accuracy,
            test_loss=float("inf") if diverged else final.test_loss,
            clock=self.shard.clock,
            steps=self.steps,
            samples=self.steps * self.task.batch_size,
            virtual_s=self.now,
            wall_s=time.perf_counter() - started,
            diverged=diverged,
            time_to_target_s=self.time_to_target,
            steps_to_target=self.steps_to_target,
            metric=metric.name,
            higher_is_better=metric.higher_is_better,
            metric_value=metric.worst if diverged else metric.of(final.test_accuracy, final.test_loss),
        )

    def _run_async(self) -> None:
        delay = self.config.delay
        queue = [(worker.duration(), worker.rank) for worker in self.workers]
        heapq.heapify(queue)
        parked: list[_Worker] = []
        padded: set[int] = set()
        while (queue or parked) and not self._done():
            if parked and (not queue or queue[0][0] > self.now) and self._release_held(parked, queue):
                continue
            if not queue:
                break
            self.now, rank = heapq.heappop(queue)
            worker = self.workers[rank]
            # Constant delay: the first D workers' first pushes are zero gradients that only move the clock.
            pad = delay is not None and rank < delay and rank not in padded
            padded.add(rank)
            outcome = self._step(worker, pad)
            self._maybe_evaluate()
            if worker.client.parked:
                worker.parked_at = self.now
                parked.append(worker)
            else:
                heapq.heappush(queue, (self.now + worker.duration(), rank))
            if outcome.pushed and parked:
                # SSP: a worker the push released pulls at once. Held pulls wait for the instant's other pushes.
                pulls_held = self.shard.pull_hold_pending
                for waiting in self._release([w for w in parked if not pulls_held(w.client.worker_id)], parked):
                    heapq.heappush(queue, (self.now + waiting.duration(), waiting.rank))
        if parked and not queue and not self._done():
            raise SimulationError("every worker is parked by SSP; this cannot happen with live workers")

    def _release_held(self, parked: list[_Worker], queue: list[tuple[float, int]]) -> bool:
        """Every event of this instant is done: workers whose pull hold is over pull now. When the
        first hold still on ends before the next event, time moves there (True: it did)."""
        for waiting in self._release(list(parked), parked):
            heapq.heappush(queue, (self.now + waiting.duration(), waiting.rank))
        ends = [hold.until_time for w in parked if (hold := self.shard.pull_hold(w.client.worker_id)) is not None]
        hold_ends = min(ends, default=None)
        if hold_ends is None or (queue and hold_ends >= queue[0][0]):
            return False
        self.now = hold_ends
        return True

    def _release(self, candidates: list[_Worker], parked: list[_Worker]) -> Iterable[_Worker]:
        """The ``candidates`` (parked) whose SSP wait or pull hold is over pull again (the shard's pull), resume."""
        released = []
        for worker in candidates:
            worker_id = worker.client.worker_id
            if self._may_resume(worker_id):
                parked.remove(worker)
                worker.client.parked = False
                worker.stats.parked_s += self.now - worker.parked_at
                self._resuming.add(worker_id)
                try:
                    worker.procedure.start()
                finally:
                    self._resuming.discard(worker_id)
                released.append(worker)
        return released

    def _run_bsp(self) -> None:
        while not self._done():
            rounds = self._play_round()
            self.now += max(turn.seconds for turn in rounds)
            for worker, turn in zip(self.workers, rounds, strict=True):
                for loss in turn.losses:
                    self._count_step(worker, loss)
                assert turn.outcome is not None
                self._record_push(worker, turn.outcome)
            self._maybe_evaluate()

    def _play_round(self) -> list[_BspTurn]:
        """Every worker's turn of one BSP round, each on its own thread; raises the first turn's
        error (a non-finite push as ``_DivergedError``) once every thread has returned."""
        rounds = [_BspTurn() for _ in self.workers]
        threads = self._start_turns(rounds)
        failed = next((turn.error for turn in rounds if turn.error is not None), None)
        if failed is not None:
            # Whoever has not pushed leaves, so the round ends and the waiting helpers return.
            for worker in self.workers:
                if not self.shard.workers[worker.client.worker_id].waiting:
                    self.shard.leave(worker.client.worker_id)
        for thread in threads:
            thread.join()
        if isinstance(failed, ShardError) and failed.kind is ErrorKind.NON_FINITE:
            raise _DivergedError
        if failed is not None:
            raise failed
        return rounds

    def _start_turns(self, rounds: list[_BspTurn]) -> list[threading.Thread]:
        """Start the workers' turns one after another, up to the first that fails."""
        threads: list[threading.Thread] = []
        for worker, turn in zip(self.workers, rounds, strict=True):
            thread = threading.Thread(target=self._bsp_turn, args=(worker, turn), daemon=True)
            thread.start()
            threads.append(thread)
            record = self.shard.workers[worker.client.worker_id]
            # The next worker pushes only once this one waits at the barrier: a fixed order of sums.
            while thread.is_alive() and not record.waiting:
                time.sleep(0)
            if turn.error is not None:
                break
        return threads

    def _bsp_turn(self, worker: _Worker, turn: _BspTurn) -> None:
        """One worker's part of a BSP round (on a helper thread): its steps up to and with its push."""
        try:
            while turn.outcome is None or not turn.outcome.pushed:
                turn.seconds += worker.duration()
                loss = self._compute(worker)
                turn.losses.append(loss)
                turn.outcome = worker.procedure.step(loss)
        except BaseException as error:  # handed to the main thread
            turn.error = error


@dataclass
class _BspTurn:
    """What one worker did in a BSP round: its virtual seconds, losses and the push's outcome."""

    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)
    outcome: StepOutcome | None = None
    error: BaseException | None = None


def simulate(config: SimConfig, task: Task | None = None) -> SimResult:
    """Run one simulated cluster; deterministic for ``config.seed``."""
    return Simulation(config, task).run()
