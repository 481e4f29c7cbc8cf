"""Out-of-band accuracy for a race: the model's parameters over time, scored after the run.

During a run nothing is evaluated (evaluation would take CPU from the workers being timed):
hetps's parameters are pulled by an observer every few seconds (:class:`ParameterRecorder`),
DDP's rank 0 copies its own. Afterwards :func:`score` finds when the task's metric first
reached the target and what it was when the budget ran out, on the task's whole test set;
the curve it draws is screened on every tenth test example, which costs a tenth as much. The
metric is the task's (:class:`psworker.task.Metric`): a test accuracy reaches the target at
or above it, a language model's validation loss at or below it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc
import torch
from torch import nn

from psproto.errors import reason_of
from psproto.reasons import Reason
from psworker.binding import ModelBinding
from psworker.client import PSClient
from psworker.task import Task, evaluate, metric_named

Snapshot = tuple[float, list[torch.Tensor]]
# A screened accuracy this far below the target is not worth a whole-test-set evaluation.
SCREEN_MARGIN = 0.02
# The same for a loss metric, this far above the target (a tenth of a validation set's mean
# cross-entropy moves by more than an accuracy does).
SCREEN_MARGIN_LOSS = 0.1
SCREEN_EVERY = 10


class ParameterRecorder:
    """A thread that pulls the server's parameters every ``interval`` seconds as an observer."""

    def __init__(self, servers: list[str], task: Task, interval: float) -> None:
        self.model = task.build_model()
        self.binding = ModelBinding(self.model, num_shards=len(servers))
        self.client = PSClient(servers, self.binding.layout, name="race-observer", observer=True)
        self.interval = interval
        self.clock: Callable[[], float] = lambda: 0.0
        self.snapshots: list[Snapshot] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="parameter-recorder", daemon=True)

    def start(self, clock: Callable[[], float]) -> None:
        """Start pulling; ``clock`` gives the seconds since the race started."""
        self.clock = clock
        self._thread.start()

    def snapshot(self) -> None:
        taken_at = self.clock()
        try:
            self.client.pull(self.binding.params)
        except grpc.RpcError as error:
            # Before the first worker's Init the model is the task's initial one, which this
            # recorder built from the same seed.
            if reason_of(error) is not Reason.NOT_INITIALIZED:
                raise
        self.binding.scatter_params()
        self.snapshots.append((taken_at, [p.detach().clone() for p in self.model.parameters()]))

    def _run(self) -> None:
        next_at = 0.0
        while not self._stop.is_set():
            if self.clock() >= next_at:
                self.snapshot()
                next_at += self.interval
            self._stop.wait(max(0.0, min(self.interval, next_at - self.clock())))

    def stop(self) -> None:
        """Stop the thread, take the final snapshot (the model at the budget), close the client."""
        self._stop.set()
        self._thread.join()
        self.snapshot()
        self.client.close()


@dataclass
class Score:
    """What a run's snapshots say: first time at the target, accuracy and loss at the budget, the curve."""

    time_to_target: float | None
    accuracy_at_budget: float
    loss_at_budget: float
    # (seconds, screened metric: accuracy, or loss for a lower-is-better task) of every snapshot.
    curve: list[tuple[float, float]] = field(default_factory=list)
    full_evaluations: int = 0
    diverged: bool = False
    metric: str = "accuracy"  # the task's metric, which the target and the curve are in

    @property
    def metric_at_budget(self) -> float:
        """The task's metric at the budget: the accuracy or the loss."""
        return metric_named(self.metric).of(self.accuracy_at_budget, self.loss_at_budget)


def _load(model: nn.Module, params: Sequence[torch.Tensor]) -> None:
    with torch.no_grad():
        for target, value in zip(model.parameters(), params, strict=True):
            target.copy_(value)


def _screen_set(task: Task) -> Task:
    from dataclasses import replace

    return replace(task, test_inputs=task.test_inputs[::SCREEN_EVERY], test_targets=task.test_targets[::SCREEN_EVERY])


def score(task: Task, snapshots: Sequence[Snapshot], target: float) -> Score:
    """Score a run's snapshots (in time order; the last is the model at the budget).

    ``target`` is in the task's metric (``task.metric``): the time to target is the first
    snapshot whose whole-test-set accuracy is at least ``target``, or, for a lower-is-better
    metric such as a language model's loss, whose loss is at most ``target``. Only snapshots
    whose screened value is within the screening margin of it are evaluated on the whole set,
    so a snapshot screened further away than that counts as not at the target."""
    if not snapshots:
        raise ValueError("no snapshots to score")
    metric = task.metric
    margin = SCREEN_MARGIN if metric.higher_is_better else SCREEN_MARGIN_LOSS
    # The screened value that is worth a whole evaluation: near the target or past it.
    screen_target = target - margin if metric.higher_is_better else target + margin
    model = task.build_model()
    screen = _screen_set(task)
    device = torch.device("cpu")
    curve: list[tuple[float, float]] = []
    time_to_target: float | None = None
    full = 0
    for taken_at, params in snapshots:
        _load(model, params)
        if not all(bool(torch.isfinite(p).all()) for p in params):
            curve.append((taken_at, metric.worst))
            continue
        screened = metric.of(*evaluate(model, screen, device))
        curve.append((taken_at, screened))
        if time_to_target is None and metric.reached(screened, screen_target):
            whole = metric.of(*evaluate(model, task, device))
            full += 1
            if metric.reached(whole, target):
                time_to_target = taken_at
    final_params = snapshots[-1][1]
    _load(model, final_params)
    diverged = not all(bool(torch.isfinite(p).all()) for p in final_params)
    accuracy, loss = (0.0, float("nan")) if diverged else evaluate(model, task, device)
    return Score(time_to_target, accuracy, loss, curve, full + (0 if diverged else 1), diverged, metric.name)


def wall_clock_since(t0: float) -> Callable[[], float]:
    """Seconds since ``t0`` (a :func:`time.time` value), on the clock every process shares."""
    return lambda: time.time() - t0
