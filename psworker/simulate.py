"""A heterogeneous cluster in one process, in virtual time, through the real shard and procedures.

Every update goes through a real :class:`psserver.core.shard.Shard` (the server's rules,
staleness, snapshots and consistency) and every worker runs the real worker procedure the
rule asks for (:mod:`psworker.procedures`), talking to the shard through :class:`SimClient`,
an in-process stand-in for :class:`psworker.client.PSClient`. Nothing sleeps and nothing
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
- BSP: a round takes the slowest worker's time; the workers' pushes go through the shard's
  BSP barrier (each non-last push waits on a helper thread, started in rank order).

Everything is deterministic for a seed: batches, step times and the order of events.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import torch

from psproto import codec
from psproto.layout import Layout
from psproto.v1 import ps_pb2
from psserver.core.consistency import Consistency, ConsistencyModel, ssp_must_wait
from psserver.core.errors import ErrorKind, ShardError
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psworker.binding import ModelBinding
from psworker.client import PSClient, PushResult
from psworker.procedures import Procedure, StepOutcome, build_procedure
from psworker.sim_tasks import sim_task
from psworker.tasks import Task, evaluate

# Leases and GEM reservations are counted in virtual seconds; nothing in a simulation expires.
_NEVER_S = 1e18


class SimulationError(ValueError):
    """A configuration the simulator cannot run."""


# -- speeds ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SpeedModel:
    """How long each worker's step takes, in virtual seconds.

    ``constant``: every step takes ``step_s``. ``groups``: worker ``r`` takes
    ``step_s × ratios[r mod len(ratios)]`` (``1:1:2:4``). ``exponential``: exponentially
    distributed with that mean. ``profile``: drawn from the step times a real run measured
    (one list per worker, cycled over ranks; see :func:`load_profile`).
    """

    kind: str = "constant"
    ratios: tuple[float, ...] = (1.0,)
    step_s: float = 1.0
    profile: tuple[tuple[float, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in {"constant", "groups", "exponential", "profile"}:
            raise SimulationError(f"unknown speed model {self.kind!r}; use constant, groups, exponential or profile")
        if not self.ratios or any(r <= 0 for r in self.ratios) or self.step_s <= 0:
            raise SimulationError("speed ratios and the step time must be positive")
        if self.kind == "profile" and not any(self.profile):
            raise SimulationError("a profile speed model needs at least one measured step time")

    @classmethod
    def parse(cls, text: str, step_s: float = 1.0) -> SpeedModel:
        """``constant``, ``1:1:2:4`` (groups), ``exp`` or ``exp:1:1:2:4``, ``profile:LOG_DIR``."""
        text = text.strip()
        if text in {"", "constant"}:
            return cls("constant", step_s=step_s)
        kind, _, rest = text.partition(":")
        if kind == "profile":
            return cls("profile", step_s=step_s, profile=load_profile(Path(rest)))
        if kind in {"exp", "exponential"}:
            return cls("exponential", _ratios(rest or "1"), step_s)
        return cls("groups", _ratios(text), step_s)

    def slowdown(self, rank: int) -> float:
        if self.kind == "profile":
            times = self.profile[rank % len(self.profile)]
            return sum(times) / len(times) / self.step_s
        return 1.0 if self.kind == "constant" else self.ratios[rank % len(self.ratios)]

    def sampler(self, rank: int, rng: random.Random) -> Callable[[], float]:
        mean = self.step_s * self.slowdown(rank)
        if self.kind == "exponential":
            return lambda: rng.expovariate(1.0 / mean)
        if self.kind == "profile":
            times = self.profile[rank % len(self.profile)]
            return lambda: rng.choice(times)
        return lambda: mean


def _ratios(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(part) for part in text.replace(",", ":").split(":") if part.strip())
    except ValueError:
        raise SimulationError(f"{text!r} is not a list of speed ratios such as 1:1:2:4") from None
    if not values:
        raise SimulationError("give at least one speed ratio")
    return values


def load_profile(log_dir: Path) -> tuple[tuple[float, ...], ...]:
    """Per-worker step times (seconds) from a real run's JSON-lines logs (``worker-*.jsonl``).

    Step events are logged every few steps with the time since start; each interval divided
    by the steps it covers is one sample. A worker with no step events contributes its
    ``compute_seconds_per_step`` from the ``done`` event.
    """
    files = sorted(log_dir.glob("worker-*.jsonl")) if log_dir.is_dir() else [log_dir]
    profiles = []
    for path in files:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        steps = [(r["step"], r["time"]) for r in records if r.get("event") == "step"]
        times = [(t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in itertools.pairwise(steps) if s1 > s0]
        times = [t for t in times if t > 0]
        if not times:
            done = [r for r in records if r.get("event") == "done" and r.get("compute_seconds_per_step")]
            times = [float(done[-1]["compute_seconds_per_step"])] if done else []
        if times:
            profiles.append(tuple(times))
    if not profiles:
        raise SimulationError(f"no step times found in {log_dir} (expected worker-*.jsonl from psworker train)")
    return tuple(profiles)


# -- configuration and results ------------------------------------------------------------------


@dataclass(frozen=True)
class SimConfig:
    rule: str = "asgd"
    options: Mapping[str, str] = field(default_factory=dict)  # the rule's options, lr included
    workers: int = 4
    speeds: SpeedModel = field(default_factory=SpeedModel)
    consistency: str = "async"  # async, ssp or bsp
    ssp_bound: int = 3
    delay: int | None = None  # constant-delay mode: every gradient applied exactly D updates late
    task: str = "digits"
    steps: int = 1000  # budget: gradients computed by all workers together
    max_updates: int | None = None  # also stop once the shard's clock reaches this
    eval_every: int = 100  # in steps
    seed: int = 0
    target_accuracy: float | None = None
    stop_at_target: bool = False
    record_pushes: bool = True

    def describe(self) -> dict[str, Any]:
        data = asdict(self)
        data["options"] = dict(self.options)
        data["speeds"] = {"kind": self.speeds.kind, "ratios": list(self.speeds.ratios), "step_s": self.speeds.step_s}
        return data


@dataclass
class CurvePoint:
    virtual_s: float
    clock: int
    steps: int
    samples: int
    test_accuracy: float
    test_loss: float
    train_loss: float


@dataclass
class WorkerStats:
    rank: int
    slowdown: float
    steps: int = 0
    pushes: int = 0
    staleness_sum: int = 0
    max_staleness: int = 0
    parked_s: float = 0.0

    @property
    def mean_staleness(self) -> float:
        return self.staleness_sum / self.pushes if self.pushes else 0.0


@dataclass
class SimResult:
    config: dict[str, Any]
    curve: list[CurvePoint]
    workers: list[WorkerStats]
    staleness_histogram: dict[int, int]
    telemetry: dict[str, float]  # mean of every telemetry key over pushes
    pushes: list[tuple[float, int, int]]  # (virtual time, rank, staleness) of every push
    test_accuracy: float
    test_loss: float
    clock: int
    steps: int
    samples: int
    virtual_s: float
    wall_s: float
    diverged: bool
    time_to_target_s: float | None = None
    steps_to_target: int | None = None

    @property
    def mean_staleness(self) -> float:
        total = sum(self.staleness_histogram.values())
        return sum(k * v for k, v in self.staleness_histogram.items()) / total if total else 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["mean_staleness"] = self.mean_staleness
        for stats in data["workers"]:
            stats["mean_staleness"] = stats["staleness_sum"] / stats["pushes"] if stats["pushes"] else 0.0
        data["staleness_histogram"] = {str(k): v for k, v in sorted(self.staleness_histogram.items())}
        return data


# -- the in-process client ----------------------------------------------------------------------


class SimClient:
    """What a worker procedure asks of ``PSClient``, answered by an in-process shard.

    Pulls and pushes go through the shard's own API (``pull``; ``begin_push``, chunks from
    ``psproto.codec.encode``, ``commit_push``), so validation and rule application are the
    server's. ``hold_pull`` is consulted before every pull: when it says the shard would make
    this worker wait (SSP), the pull is skipped and the worker is marked ``parked``.
    """

    def __init__(self, shard: Shard, layout: Layout, name: str, hold_pull: Callable[[int], bool]) -> None:
        self.shard = shard
        self.layout = layout
        self.name = name
        self.worker_id = shard.join(name, "sim", False, layout, layout.hash).worker.worker_id
        self._hold_pull = hold_pull
        self._push_ids = 0
        self.parked = False
        rule = shard.rule
        assert rule is not None
        self.rule = ps_pb2.RuleInfo(
            name=rule.name, worker_procedure=rule.worker_procedure, procedure_options=rule.procedure_options()
        )

    @property
    def initialized(self) -> bool:
        return self.shard.initialized

    @property
    def clock(self) -> int:
        return self.shard.workers[self.worker_id].pulled_clock

    def init(self, flat: torch.Tensor) -> bool:
        assembler = self.shard.begin_upload(self.worker_id, self.layout.hash)
        for chunk in codec.encode(flat):
            self.shard.decode_chunk(assembler, chunk)
        applied, _ = self.shard.finish_upload(assembler)
        return applied

    def pull(self, out: torch.Tensor, reserve: bool = False) -> int:
        if self._hold_pull(self.worker_id):
            self.parked = True
            return self.clock
        result = self.shard.pull(self.worker_id, ps_pb2.DTYPE_FLOAT32, reserve=reserve)
        assembler = codec.Assembler(out)
        for chunk in result.chunks:
            assembler.add(chunk)
        assembler.finish()
        return result.clock

    def push(
        self,
        flat: torch.Tensor,
        kind: ps_pb2.PayloadKind.ValueType = ps_pb2.PAYLOAD_KIND_GRADIENT,
        metadata: Mapping[str, float] | None = None,
        pull_into: torch.Tensor | None = None,
    ) -> list[PushResult]:
        self._push_ids += 1
        pending = self.shard.begin_push(
            self.worker_id, self._push_ids, self.clock, int(kind), self.layout.hash, dict(metadata or {})
        )
        try:
            for chunk in codec.encode(flat):
                self.shard.add_chunk(pending, chunk)
            outcome = self.shard.commit_push(pending)
        finally:
            self.shard.discard_push(pending)
        if pull_into is not None:
            self.pull(pull_into)
        return [PushResult(outcome.clock, outcome.staleness, outcome.duplicate, outcome.telemetry)]


# -- the simulation ---------------------------------------------------------------------------


@dataclass
class _Worker:
    rank: int
    model: torch.nn.Module
    binding: ModelBinding
    client: SimClient
    procedure: Procedure
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
        self.task = task or sim_task(config.task)
        consistency = Consistency(ConsistencyModel(config.consistency), config.ssp_bound)
        self.now = 0.0
        self.shard = Shard(
            ShardConfig(
                RuleSpec.parse(config.rule, dict(config.options)),
                lease_seconds=_NEVER_S,
                consistency=consistency,
                reservation_seconds=_NEVER_S,
            ),
            clock_source=lambda: self.now,
        )
        self.rng = random.Random(config.seed)
        count = config.delay + 1 if config.delay is not None else config.workers
        speeds = SpeedModel("constant", step_s=config.speeds.step_s) if config.delay is not None else config.speeds
        self.workers = [self._make_worker(rank, speeds) for rank in range(count)]
        if self.workers[0].procedure.name != "gradient" and config.consistency == "bsp":
            raise SimulationError("BSP is simulated for rules whose worker procedure is 'gradient'")
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
        if c.delay is not None and (c.delay < 0 or c.consistency != "async"):
            raise SimulationError("the constant delay must be >= 0 and runs asynchronously")

    def _make_worker(self, rank: int, speeds: SpeedModel) -> _Worker:
        model = self.task.build_model()
        binding = ModelBinding(model)
        client = SimClient(self.shard, binding.layout, f"sim-{rank}", self._hold_pull)
        if not client.initialized:
            client.init(binding.gather_params())
        procedure = build_procedure(cast(PSClient, client), binding)
        procedure.start()
        batches = torch.Generator().manual_seed(self.config.seed * 1000 + rank)
        duration = speeds.sampler(rank, random.Random(self.rng.getrandbits(64)))
        return _Worker(
            rank, model, binding, client, procedure, batches, duration, WorkerStats(rank, speeds.slowdown(rank))
        )

    def _hold_pull(self, worker_id: int) -> bool:
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
        target = self.config.target_accuracy
        if target is not None and self.time_to_target is None and accuracy >= target:
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
        )

    def _run_async(self) -> None:
        delay = self.config.delay
        queue = [(worker.duration(), worker.rank) for worker in self.workers]
        heapq.heapify(queue)
        parked: list[_Worker] = []
        padded: set[int] = set()
        while queue and not self._done():
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
                for waiting in self._release(parked):
                    heapq.heappush(queue, (self.now + waiting.duration(), waiting.rank))
        if parked and not queue and not self._done():
            raise SimulationError("every worker is parked by SSP; this cannot happen with live workers")

    def _release(self, parked: list[_Worker]) -> Iterable[_Worker]:
        """Parked workers whose SSP wait is over pull again (the shard's own pull) and resume."""
        released = []
        for worker in list(parked):
            if not self._hold_pull(worker.client.worker_id):
                parked.remove(worker)
                worker.client.parked = False
                worker.stats.parked_s += self.now - worker.parked_at
                worker.procedure.start()
                released.append(worker)
        return released

    def _run_bsp(self) -> None:
        while not self._done():
            self.now += max(worker.duration() for worker in self.workers)
            losses = [self._compute(worker) for worker in self.workers]
            outcomes: list[StepOutcome | BaseException | None] = [None] * len(self.workers)
            threads = []
            for index, (worker, loss) in enumerate(zip(self.workers, losses, strict=True)):

                def step(
                    index: int = index,
                    worker: _Worker = worker,
                    loss: float = loss,
                    outcomes: list[StepOutcome | BaseException | None] = outcomes,
                ) -> None:
                    try:
                        outcomes[index] = worker.procedure.step(loss)
                    except BaseException as error:  # handed to the main thread
                        outcomes[index] = error

                thread = threading.Thread(target=step, daemon=True)
                thread.start()
                threads.append(thread)
                record = self.shard.workers[worker.client.worker_id]
                # The next worker pushes only once this one waits at the barrier: a fixed order of sums.
                while thread.is_alive() and not record.waiting:
                    time.sleep(0)
            for thread in threads:
                thread.join()
            for worker, loss, outcome in zip(self.workers, losses, outcomes, strict=True):
                if isinstance(outcome, ShardError) and outcome.kind is ErrorKind.NON_FINITE:
                    raise _DivergedError
                if isinstance(outcome, BaseException):
                    raise outcome
                assert outcome is not None
                self._count_step(worker, loss)
                self._record_push(worker, outcome)
            self._maybe_evaluate()


def simulate(config: SimConfig, task: Task | None = None) -> SimResult:
    """Run one simulated cluster; deterministic for ``config.seed``."""
    return Simulation(config, task).run()
