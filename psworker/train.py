"""The worker's training loop: sample batches, run the server's procedure, log, evaluate."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from psproto import codec
from psworker.binding import ModelBinding
from psworker.channels import replica_sets
from psworker.client import ClientConfig, PSClient
from psworker.pacing import Pace
from psworker.procedures import Procedure, StepCounts, StepOutcome
from psworker.push_encoding import wire_dtypes
from psworker.startup import start_worker
from psworker.task import Task, evaluate, perplexity

# Where a GPU worker's 8-bit push is encoded (TrainConfig.encode_on).
ENCODE_PLACES = ("device", "host")


@dataclass(frozen=True)
class TrainConfig:
    """Every setting of a training run but the task (``psworker train --config``'s ``[train]`` table)."""

    # HOST:PORT of every shard, in shard order; a replicated shard as its replicas, HOST:PORT|HOST:PORT.
    servers: tuple[str, ...]
    # Unique worker name (default: host and process).
    name: str | None = None
    # auto, cpu, cuda or cuda:N.
    device: str = "auto"
    # Run this many times slower, to emulate a slower GPU (at least 1).
    slowdown: float = 1.0
    # Seconds of a full-speed step: every step lasts slowdown times this (an emulated device of
    # fixed speed, psworker.pacing); unset: the slowdown scales the measured compute time.
    step_seconds: float | None = None
    # Stop after this many local steps (the first of the three limits reached ends the run;
    # psworker train stops at until_clock 1000 when none is set).
    max_steps: int | None = None
    # Stop once the server has applied this many updates.
    until_clock: int | None = None
    # Stop after this many seconds of training.
    max_seconds: float | None = None
    # Evaluate on the test set every this many steps (0: never).
    eval_every: int = 200
    # Seed of the batch sampler.
    seed: int = 0
    # JSON-lines log of the run.
    log_file: Path | None = None
    # Show a progress bar.
    progress: bool = True
    # Seconds between heartbeats (the worker's speed, for the server's metrics).
    heartbeat_seconds: float = 5.0
    # (index, count): this worker trains on part index of count disjoint parts of the training set
    # (the task arrives already cut; the run logs it).
    shard_data: tuple[int, int] | None = None
    # Pull the final model and evaluate it on the test set (NaN in the summary when not).
    evaluate_at_end: bool = True
    # Where a GPU worker encodes its 8-bit pushes: "device" (only the 8-bit values cross to the
    # host) or "host" (the fp32 gradients cross, then the host's CPU encodes them).
    encode_on: str = "device"
    # How the worker talks to its shards (psworker.client.ClientConfig).
    client: ClientConfig = field(default_factory=ClientConfig)

    def __post_init__(self) -> None:
        object.__setattr__(self, "servers", tuple(self.servers))
        if not self.servers:
            raise ValueError("servers: give the address of every shard")
        replica_sets(self.servers)
        if self.encode_on not in ENCODE_PLACES:
            raise ValueError(f"encode_on {self.encode_on!r} is not one of {', '.join(ENCODE_PLACES)}")
        if not self.slowdown >= 1.0:
            raise ValueError(f"slowdown {self.slowdown} is below 1 (1 = full speed)")
        positive = {"step_seconds": self.step_seconds, "max_steps": self.max_steps, "max_seconds": self.max_seconds}
        positive |= {"until_clock": self.until_clock, "heartbeat_seconds": self.heartbeat_seconds}
        for key, value in positive.items():
            if value is not None and not value > 0:
                raise ValueError(f"{key} must be positive, not {value}")
        if self.eval_every < 0:
            raise ValueError(f"eval_every must be 0 (never) or more, not {self.eval_every}")
        if self.shard_data is not None and not 0 <= self.shard_data[0] < self.shard_data[1]:
            raise ValueError(f"shard_data {list(self.shard_data)}: give [INDEX, COUNT] with 0 <= INDEX < COUNT")


@dataclass
class TrainSummary:
    name: str
    device: str
    steps: int
    pushes: int
    mean_staleness: float
    max_staleness: int
    compute_seconds_per_step: float
    test_accuracy: float
    test_loss: float
    final_clock: int
    telemetry: dict[str, float] = field(default_factory=dict)
    # Calls retried, shards re-joined, connections replaced, calls sent to another replica of their
    # shard (following the primary), and (shard, clock seen, clock after restart) per rollback.
    retries: int = 0
    rejoins: int = 0
    reconnects: int = 0
    follows: int = 0
    duplicate_acks: int = 0
    rollbacks: list[list[int]] = field(default_factory=list)
    # Steps whose compute took longer than the emulated device's step time (--step-time).
    overrun_steps: int = 0
    # The task's metric (psworker.task.Metric): its name, direction and final value; for a
    # loss metric also the perplexity exp(loss).
    metric: str = "accuracy"
    higher_is_better: bool = True
    metric_value: float = math.nan
    perplexity: float | None = None


def pick_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but no CUDA device is available")
    return device


class JsonLog:
    """One JSON object per line: what happened, when, at which step and server clock."""

    def __init__(self, stream: IO[str] | None) -> None:
        self.stream = stream
        self.started = time.monotonic()

    def write(self, event: str, **fields: Any) -> None:
        if self.stream is None:
            return
        record = {"event": event, "time": round(time.monotonic() - self.started, 4), **fields}
        self.stream.write(json.dumps(record) + "\n")
        self.stream.flush()


@contextmanager
def _progress(enabled: bool, total: int | None, description: str) -> Iterator[Progress | None]:
    if not enabled:
        yield None
        return
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
    )
    with Progress(*columns, transient=False) as progress:
        yield progress


class _Steps(StepCounts):
    """Computes a step's gradient on a sampled batch, paced to the emulated device, and counts
    what the steps did (pushes, staleness, compute time)."""

    def __init__(self, config: TrainConfig, task: Task, model: torch.nn.Module, device: torch.device) -> None:
        self.task, self.model, self.device = task, model, device
        self.pace = Pace(config.slowdown, config.step_seconds)
        self.generator = torch.Generator().manual_seed(config.seed)
        self.train_x = task.train_inputs.to(device)
        self.train_y = task.train_targets.to(device)
        self.compute_seconds = 0.0
        super().__init__()
        self.telemetry: dict[str, float] = {}

    def warm_up(self) -> None:
        """One untimed forward/backward: CUDA context, cuDNN autotuning and allocator warm-up would
        otherwise count as compute time and be multiplied by the slowdown."""
        batch = torch.arange(min(self.task.batch_size, self.task.train_size), device=self.device)
        self.task.loss(self.model(self.train_x[batch]), self.train_y[batch]).backward()  # type: ignore[no-untyped-call]
        self.model.zero_grad(set_to_none=False)

    def gradient(self) -> float:
        started = time.perf_counter()
        task = self.task
        index = torch.randint(0, task.train_size, (task.batch_size,), generator=self.generator).to(self.device)
        self.model.zero_grad(set_to_none=False)
        loss = task.loss(self.model(self.train_x[index]), self.train_y[index])
        loss.backward()  # type: ignore[no-untyped-call]
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        # A worker X times slower idles until its step has lasted as long as on an X times slower GPU.
        self.compute_seconds += self.pace.finish_step(time.perf_counter() - started)
        return float(loss.detach())

    def count(self, outcome: StepOutcome) -> None:
        super().count(outcome)
        if outcome.pushed:
            self.telemetry = outcome.telemetry

    def speed(self) -> dict[str, float]:
        """What a heartbeat tells the server about this worker."""
        return {
            "compute_seconds": self.compute_seconds / self.steps,
            "samples_per_second": self.task.batch_size * self.steps / max(self.compute_seconds, 1e-9),
        }


def _done(config: TrainConfig, steps: int, clock: int, seconds: float) -> bool:
    """Whether the first of the run's limits is reached."""
    return (
        (config.max_steps is not None and steps >= config.max_steps)
        or (config.until_clock is not None and clock >= config.until_clock)
        or (config.max_seconds is not None and seconds >= config.max_seconds)
    )


def _log_step(log: JsonLog, config: TrainConfig, steps: _Steps, clock: int, outcome: StepOutcome) -> None:
    """The step's evaluation (every ``eval_every`` steps) and its record (every 10)."""
    task, n = steps.task, steps.steps
    if config.eval_every and n % config.eval_every == 0:
        accuracy, test_loss = evaluate(steps.model, task, steps.device)
        metric_value = task.metric.of(accuracy, test_loss)
        log.write(
            "eval",
            step=n,
            clock=clock,
            test_accuracy=accuracy,
            test_loss=test_loss,
            metric=task.metric.name,
            metric_value=metric_value,
        )
    if n % 10 == 0:
        log.write(
            "step", step=n, clock=clock, loss=outcome.loss, staleness=outcome.staleness, telemetry=outcome.telemetry
        )


def _log_rollbacks(log: JsonLog, client: PSClient, step: int, logged: int) -> int:
    """Log the rollbacks the client saw since the first ``logged``; returns how many are logged now."""
    for rollback in client.rollbacks[logged:]:
        log.write(
            "rollback",
            step=step,
            shard=rollback.shard,
            seen_clock=rollback.seen_clock,
            clock=rollback.clock,
            lost_updates=rollback.lost_updates,
        )
    return len(client.rollbacks)


def train(config: TrainConfig, task: Task) -> TrainSummary:
    """Train ``task`` until ``max_steps``, the clock reaching ``until_clock`` or ``max_seconds``, whichever comes first.

    The task is used as it is (already cut to ``config.shard_data`` if it should be): finding a
    task by name is the command's business (:mod:`pstasks`), not the library's."""
    if config.max_steps is None and config.until_clock is None and config.max_seconds is None:
        raise ValueError("give max_steps, until_clock or max_seconds, or training never ends")
    device = pick_device(config.device)
    model = task.build_model().to(device)
    push, _ = wire_dtypes(config.client.wire_dtype, config.client.push_dtype, config.client.pull_dtype)
    push_on_device = config.encode_on == "device" and push == codec.INT8_BLOCK
    binding = ModelBinding(model, num_shards=len(config.servers), push_on_device=push_on_device)
    steps = _Steps(config, task, model, device)
    with ExitStack() as stack:
        # A shard that restarted without a checkpoint is re-initialised from this worker's model.
        client = PSClient(
            config.servers, binding.layout, config.name, str(device), reinit=binding.gather_params, config=config.client
        )
        stack.callback(client.close)
        log = JsonLog(stack.enter_context(config.log_file.open("a")) if config.log_file else None)
        procedure = start_worker(
            client,
            binding,
            on_init=lambda applied: log.write("init", applied=applied),
            build_optimizer=task.build_optimizer,
        )
        log.write(
            "start",
            name=client.name,
            device=str(device),
            rule=client.rule.name,
            procedure=procedure.name,
            clock=client.clock,
            slowdown=config.slowdown,
            train_examples=task.train_size,
            data_shard=list(config.shard_data) if config.shard_data is not None else None,
        )
        steps.warm_up()
        _loop(config, steps, client, procedure, log)
        client.pull(binding.params)
        binding.scatter_params()
        summary = _summary(config, steps, client, device)
        log.write("done", **asdict(summary))
        return summary


def _loop(config: TrainConfig, steps: _Steps, client: PSClient, procedure: Procedure[Any], log: JsonLog) -> None:
    """Step until a limit is reached, then push what the procedure still holds."""
    clock = client.clock
    rollbacks_logged = 0
    last_heartbeat = training_started = time.monotonic()
    total = config.max_steps if config.max_steps is not None else config.until_clock
    with _progress(config.progress, total, client.name) as progress:
        bar = progress.add_task(client.name, total=total, info="") if progress else None
        while not _done(config, steps.steps, clock, time.monotonic() - training_started):
            outcome = procedure.step(steps.gradient())
            steps.count(outcome)
            if outcome.pushed:
                clock = client.clock
            rollbacks_logged = _log_rollbacks(log, client, steps.steps, rollbacks_logged)
            if time.monotonic() - last_heartbeat >= config.heartbeat_seconds:
                client.heartbeat(steps.speed())
                last_heartbeat = time.monotonic()
            _log_step(log, config, steps, clock, outcome)
            if progress is not None and bar is not None:
                done = steps.steps if config.max_steps is not None else min(clock, total or clock)
                progress.update(bar, completed=done, info=f"loss {outcome.loss:.3f} τ {outcome.staleness}")
        if procedure.finish() is not None:
            steps.pushes += 1


def _summary(config: TrainConfig, steps: _Steps, client: PSClient, device: torch.device) -> TrainSummary:
    """The run's summary, with the final model's evaluation (NaN without ``evaluate_at_end``)."""
    task = steps.task
    accuracy, test_loss = evaluate(steps.model, task, device) if config.evaluate_at_end else (math.nan, math.nan)
    n = steps.steps
    return TrainSummary(
        name=client.name,
        device=str(device),
        steps=n,
        pushes=steps.pushes,
        mean_staleness=steps.mean_staleness,
        max_staleness=steps.max_staleness,
        compute_seconds_per_step=steps.compute_seconds / n if n else 0.0,
        test_accuracy=accuracy,
        test_loss=test_loss,
        final_clock=client.clock,
        telemetry=steps.telemetry,
        retries=client.stats.retries,
        rejoins=client.stats.rejoins,
        reconnects=client.stats.reconnects,
        follows=client.stats.follows,
        duplicate_acks=client.stats.duplicate_acks,
        rollbacks=[[r.shard, r.seen_clock, r.clock] for r in client.rollbacks],
        overrun_steps=steps.pace.overruns,
        metric=task.metric.name,
        higher_is_better=task.metric.higher_is_better,
        metric_value=task.metric.of(accuracy, test_loss),
        perplexity=None if task.metric.higher_is_better else perplexity(test_loss),
    )
