"""The worker processes of a time-to-accuracy race: a hetps worker and a PyTorch DDP rank.

Both train the same task on the same part of the training set with the same per-worker batch,
seed and emulated speed (:class:`psworker.pacing.Pace`); both load everything, say they are
ready, wait for the start signal and train until the wall budget is spent. Their results go
back on a queue as plain dicts. The DDP rank is what a user runs today: ``torch.distributed``
over gloo and ``DistributedDataParallel``, every step waiting for the slowest rank.
"""

from __future__ import annotations

import math
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import grpc
import torch

from psproto.errors import reason_of
from psproto.reasons import Reason

if TYPE_CHECKING:
    from psworker.pacing import Pace


class StartSignal(Protocol):
    """What the race hands its workers: a start event and the wall-clock time it was set at."""

    def wait(self, timeout: float | None = None) -> bool: ...


@dataclass(frozen=True)
class RaceWorker:
    """One worker of a race: who it is, what it trains and how fast it is."""

    rank: int
    workers: int
    task: str
    data_dir: Path | None
    seed: int
    slowdown: float
    step_seconds: float
    budget_seconds: float


def _task_part(spec: RaceWorker) -> Any:
    from pstasks.tasks import load_task

    task = load_task(spec.task, spec.data_dir)
    return task.shard(spec.rank, spec.workers) if spec.workers > 1 and task.disjoint_shards else task


def _report_failure(messages: Any, spec: RaceWorker) -> None:
    messages.put(("error", {"rank": spec.rank, "error": traceback.format_exc()}))


def hetps_worker(
    spec: RaceWorker, servers: list[str], start: StartSignal, messages: Any
) -> None:  # pragma: no cover - runs in a child process
    """A ``psworker train`` loop (:func:`psworker.train.train`) that starts on the race's signal."""
    try:
        from psworker.train import TrainConfig, train

        torch.set_num_threads(1)
        task = _task_part(spec)
        config = TrainConfig(
            tuple(servers),
            name=f"worker-{spec.rank}",
            device="cpu",
            slowdown=spec.slowdown,
            max_steps=None,
            until_clock=None,
            eval_every=0,
            seed=spec.seed * 1000 + spec.rank,
            progress=False,
            max_seconds=spec.budget_seconds,
            step_seconds=spec.step_seconds,
            evaluate_at_end=False,
        )
        messages.put(("ready", spec.rank))
        start.wait()
        try:
            summary = train(config, task)
        except grpc.RpcError as error:
            if reason_of(error) is not Reason.NON_FINITE:
                raise
            # The rate is too large: the model diverged and the server refused the NaN. A
            # result, not a failure of the race (a sweep's largest rates are expected to do this).
            messages.put(("result", {**_diverged(spec), "batch_size": task.batch_size}))
            return
        messages.put(("result", {"rank": spec.rank, **asdict(summary), "batch_size": task.batch_size}))
    except BaseException:
        _report_failure(messages, spec)


def _diverged(spec: RaceWorker) -> dict[str, Any]:
    return {
        "rank": spec.rank,
        "steps": 0,
        "pushes": 0,
        "mean_staleness": 0.0,
        "max_staleness": 0,
        "overrun_steps": 0,
        "diverged": True,
    }


@dataclass(frozen=True)
class DdpSettings:
    """How the DDP side trains: rendezvous address, learning rate, snapshot cadence."""

    address: str
    lr: float
    momentum: float
    snapshot_seconds: float
    snapshot_file: Path


def _paced_model(task: Any, pace: Pace) -> tuple[Any, list[float]]:  # pragma: no cover - in a child process
    """``task``'s model under DDP, its last gradient bucket held back by ``pace`` before its
    all-reduce; and the one-item list the training loop writes each step's start time into."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(task.build_model())
    step_started = [0.0]

    def paced_allreduce(bucket: Any) -> torch.futures.Future[torch.Tensor]:
        if bucket.is_last():
            pace.finish_step(time.perf_counter() - step_started[0])
        return default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]

    # DDP checks a hook's annotations at run time, and these would be strings here: a lambda has none.
    model.register_comm_hook(None, lambda state, bucket: paced_allreduce(bucket))
    return model, step_started


def ddp_rank(
    spec: RaceWorker, settings: DdpSettings, start: StartSignal, started_at: Any, messages: Any
) -> None:  # pragma: no cover - runs in a child process
    """One DDP rank: SGD with momentum on the all-reduced gradients, paced like a hetps worker.

    The pace's idle time is spent in the communication hook of the last gradient bucket, just
    before its all-reduce: the moment a slower GPU would deliver its gradients."""
    try:
        import torch.distributed as dist

        from psworker.pacing import Pace

        torch.set_num_threads(1)
        task = _task_part(spec)
        dist.init_process_group(
            "gloo", init_method=f"tcp://{settings.address}", rank=spec.rank, world_size=spec.workers
        )
        pace = Pace(spec.slowdown, spec.step_seconds)
        model, step_started = _paced_model(task, pace)
        optimizer = torch.optim.SGD(model.parameters(), lr=settings.lr, momentum=settings.momentum)
        generator = torch.Generator().manual_seed(spec.seed * 1000 + spec.rank)
        # One untimed step's worth of forward/backward outside DDP's hooks: allocator warm-up.
        batch = torch.arange(min(task.batch_size, task.train_size))
        task.loss(model.module(task.train_inputs[batch]), task.train_targets[batch]).backward()
        optimizer.zero_grad(set_to_none=False)
        dist.barrier()
        messages.put(("ready", spec.rank))
        start.wait()
        t0 = started_at.value
        snapshots: list[tuple[float, list[torch.Tensor]]] = []
        next_snapshot = 0.0
        steps = 0
        stop = torch.zeros(1)
        while True:
            elapsed = time.time() - t0
            if spec.rank == 0 and elapsed >= next_snapshot:
                snapshots.append((elapsed, [p.detach().clone() for p in model.module.parameters()]))
                next_snapshot += settings.snapshot_seconds
            # Every rank must take the same number of steps, or an all-reduce waits forever.
            stop.fill_(1.0 if elapsed >= spec.budget_seconds else 0.0)
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
            if stop.item() > 0:
                break
            step_started[0] = time.perf_counter()
            index = torch.randint(0, task.train_size, (task.batch_size,), generator=generator)
            optimizer.zero_grad(set_to_none=False)
            task.loss(model(task.train_inputs[index]), task.train_targets[index]).backward()
            optimizer.step()
            steps += 1
        if spec.rank == 0:
            snapshots.append((time.time() - t0, [p.detach().clone() for p in model.module.parameters()]))
            torch.save(snapshots, settings.snapshot_file)
        dist.destroy_process_group()
        messages.put(
            (
                "result",
                {
                    "rank": spec.rank,
                    "steps": steps,
                    "pushes": steps,
                    "mean_staleness": 0.0,
                    "max_staleness": 0,
                    "overrun_steps": pace.overruns,
                    "batch_size": task.batch_size,
                    "test_accuracy": math.nan,
                },
            )
        )
    except BaseException:
        _report_failure(messages, spec)
