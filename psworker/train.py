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
from psworker.client import ClientConfig, PSClient
from psworker.pacing import Pace
from psworker.push_encoding import wire_dtypes
from psworker.startup import start_worker
from psworker.task import Task, evaluate, perplexity

# Where a GPU worker's 8-bit push is encoded (TrainConfig.encode_on).
ENCODE_PLACES = ("device", "host")


@dataclass(frozen=True)
class TrainConfig:
    """Every setting of a training run but the task (``psworker train --config``'s ``[train]`` table)."""

    # HOST:PORT of every shard, in shard order.
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
    # Calls retried, shards re-joined, and (shard, clock seen, clock after restart) per rollback.
    retries: int = 0
    rejoins: int = 0
    reconnects: int = 0
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


def train(config: TrainConfig, task: Task) -> TrainSummary:
    """Train ``task`` until ``max_steps``, the clock reaching ``until_clock`` or ``max_seconds``, whichever comes first.

    The task is used as it is (already cut to ``config.shard_data`` if it should be): finding a
    task by name is the command's business (:mod:`pstasks`), not the library's."""
    if config.max_steps is None and config.until_clock is None and config.max_seconds is None:
        raise ValueError("give max_steps, until_clock or max_seconds, or training never ends")
    pace = Pace(config.slowdown, config.step_seconds)
    device = pick_device(config.device)
    model = task.build_model().to(device)
    push, _ = wire_dtypes(config.client.wire_dtype, config.client.push_dtype, config.client.pull_dtype)
    push_on_device = config.encode_on == "device" and push == codec.INT8_BLOCK
    binding = ModelBinding(model, num_shards=len(config.servers), push_on_device=push_on_device)
    generator = torch.Generator().manual_seed(config.seed)
    train_x = task.train_inputs.to(device)
    train_y = task.train_targets.to(device)

    with ExitStack() as stack:
        # A shard that restarted without a checkpoint is re-initialised from this worker's model.
        client = PSClient(
            config.servers, binding.layout, config.name, str(device), reinit=binding.gather_params, config=config.client
        )
        stack.callback(client.close)
        log_stream = stack.enter_context(config.log_file.open("a")) if config.log_file else None
        log = JsonLog(log_stream)
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

        compute_seconds = 0.0

        def compute_gradient() -> float:
            nonlocal compute_seconds
            started = time.perf_counter()
            index = torch.randint(0, task.train_size, (task.batch_size,), generator=generator).to(device)
            model.zero_grad(set_to_none=False)
            loss = task.loss(model(train_x[index]), train_y[index])
            loss.backward()  # type: ignore[no-untyped-call]
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - started
            # A worker X times slower idles until its step has lasted as long as on an X times slower GPU.
            compute_seconds += pace.finish_step(elapsed)
            return float(loss.detach())

        # One untimed forward/backward first: CUDA context, cuDNN autotuning and allocator warm-up
        # would otherwise count as compute time and be multiplied by --slowdown.
        batch = torch.arange(min(task.batch_size, task.train_size), device=device)
        task.loss(model(train_x[batch]), train_y[batch]).backward()  # type: ignore[no-untyped-call]
        model.zero_grad(set_to_none=False)

        steps = pushes = staleness_sum = max_staleness = 0
        clock = client.clock
        rollbacks_logged = 0
        telemetry: dict[str, float] = {}
        last_heartbeat = time.monotonic()
        total = config.max_steps if config.max_steps is not None else config.until_clock
        training_started = time.monotonic()
        with _progress(config.progress, total, client.name) as progress:
            bar = progress.add_task(client.name, total=total, info="") if progress else None
            while True:
                if config.max_steps is not None and steps >= config.max_steps:
                    break
                if config.until_clock is not None and clock >= config.until_clock:
                    break
                if config.max_seconds is not None and time.monotonic() - training_started >= config.max_seconds:
                    break
                outcome = procedure.step(compute_gradient())
                steps += 1
                if outcome.pushed:
                    pushes += 1
                    staleness_sum += outcome.staleness
                    max_staleness = max(max_staleness, outcome.staleness)
                    telemetry = outcome.telemetry
                    clock = client.clock
                for rollback in client.rollbacks[rollbacks_logged:]:
                    log.write(
                        "rollback",
                        step=steps,
                        shard=rollback.shard,
                        seen_clock=rollback.seen_clock,
                        clock=rollback.clock,
                        lost_updates=rollback.lost_updates,
                    )
                rollbacks_logged = len(client.rollbacks)
                if time.monotonic() - last_heartbeat >= config.heartbeat_seconds:
                    client.heartbeat(
                        {
                            "compute_seconds": compute_seconds / steps,
                            "samples_per_second": task.batch_size * steps / max(compute_seconds, 1e-9),
                        }
                    )
                    last_heartbeat = time.monotonic()
                if config.eval_every and steps % config.eval_every == 0:
                    accuracy, test_loss = evaluate(model, task, device)
                    log.write(
                        "eval",
                        step=steps,
                        clock=clock,
                        test_accuracy=accuracy,
                        test_loss=test_loss,
                        metric=task.metric.name,
                        metric_value=task.metric.of(accuracy, test_loss),
                    )
                if steps % 10 == 0:
                    log.write(
                        "step",
                        step=steps,
                        clock=clock,
                        loss=outcome.loss,
                        staleness=outcome.staleness,
                        telemetry=outcome.telemetry,
                    )
                if progress is not None and bar is not None:
                    done = steps if config.max_steps is not None else min(clock, total or clock)
                    progress.update(bar, completed=done, info=f"loss {outcome.loss:.3f} τ {outcome.staleness}")
            flushed = procedure.finish()
            if flushed is not None:
                pushes += 1
        client.pull(binding.params)
        binding.scatter_params()
        accuracy, test_loss = evaluate(model, task, device) if config.evaluate_at_end else (math.nan, math.nan)
        summary = TrainSummary(
            name=client.name,
            device=str(device),
            steps=steps,
            pushes=pushes,
            mean_staleness=staleness_sum / pushes if pushes else 0.0,
            max_staleness=max_staleness,
            compute_seconds_per_step=compute_seconds / steps if steps else 0.0,
            test_accuracy=accuracy,
            test_loss=test_loss,
            final_clock=client.clock,
            telemetry=telemetry,
            retries=client.stats.retries,
            rejoins=client.stats.rejoins,
            reconnects=client.stats.reconnects,
            duplicate_acks=client.stats.duplicate_acks,
            rollbacks=[[r.shard, r.seen_clock, r.clock] for r in client.rollbacks],
            overrun_steps=pace.overruns,
            metric=task.metric.name,
            higher_is_better=task.metric.higher_is_better,
            metric_value=task.metric.of(accuracy, test_loss),
            perplexity=None if task.metric.higher_is_better else perplexity(test_loss),
        )
        log.write("done", **asdict(summary))
        return summary
