"""The race's scoring and targets follow the task's metric: a loss target is reached at or below it."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch import nn

from experiments.harness.race import RunResult
from experiments.harness.snapshots import Snapshot, score
from experiments.tta_report import aggregate, targets
from pstools.sim_tasks import digits_mlp
from psworker.task import LOSS


def _snapshots(model: nn.Module, times: list[float]) -> list[Snapshot]:
    return [(t, [p.detach().clone() for p in model.parameters()]) for t in times]


def test_a_loss_target_is_reached_by_the_first_snapshot_at_or_below_it() -> None:
    task = replace(digits_mlp(), metric=LOSS)
    untrained = task.build_model()
    trained = task.build_model()
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.2, momentum=0.9)
    for _ in range(30):
        optimizer.zero_grad()
        task.loss(trained(task.train_inputs), task.train_targets).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    snapshots = _snapshots(untrained, [0.0, 1.0]) + _snapshots(trained, [2.0, 3.0])
    scored = score(task, snapshots, target=1.0)
    assert scored.metric == "loss"
    assert scored.time_to_target == 2.0
    assert scored.loss_at_budget < 1.0 and scored.metric_at_budget == scored.loss_at_budget
    # The curve is in the metric: the untrained loss (about ln 10) above the trained one.
    assert scored.curve[0][1] > 2.0 and scored.curve[-1][1] < 1.0
    # A loss target below what the model reaches is never reached, however high its accuracy.
    assert score(task, snapshots, target=0.001).time_to_target is None
    # The same snapshots judged by accuracy: a target of 1.0 (100 %) is not reached.
    assert score(replace(task, metric=digits_mlp().metric), snapshots, target=1.0).time_to_target is None
    diverged = [(0.0, [torch.full_like(p, math.nan) for p in untrained.parameters()])]
    nan_scored = score(task, diverged, target=1.0)
    assert nan_scored.diverged and nan_scored.curve == [(0.0, math.inf)]


def _run(system: str, seed: int, reached: float | None, loss: float) -> RunResult:
    worker = {"rank": 0, "slowdown": 1.0, "steps": 10, "pushes": 10, "mean_staleness": 1.0, "overrun_steps": 0}
    return RunResult(system, 0.01, [1.0], seed, reached, 0.5, loss, 100.0, False, [worker], [], 1.0)


def test_loss_targets_compare_the_final_loss_the_right_way_round() -> None:
    runs = [
        *(_run("ddp", seed, t, 1.50) for seed, t in enumerate([30.0, 32.0, 34.0])),
        *(_run("asgd", seed, t, 1.60) for seed, t in enumerate([10.0, 12.0, 14.0])),
        *(_run("sa", seed, t, 1.45) for seed, t in enumerate([10.0, 12.0, 14.0])),
    ]
    summary = aggregate(runs, LOSS)
    assert summary["1"]["sa"]["metric_at_budget"]["median"] == 1.45
    speed, final = targets(summary, "1", LOSS)
    # Tied on time: the lower loss wins; positive gap = better than DDP.
    assert speed["best_rule"] == "sa" and speed["pass"]
    assert final["measured"] == pytest.approx(0.05) and final["pass"]
    worse = targets(aggregate([r for r in runs if r.system != "sa"], LOSS), "1", LOSS)[1]
    assert worse["measured"] == pytest.approx(-0.10) and not worse["pass"]
