"""Windowed procedures follow the local steps a real in-process shard assigns them (DyLU).

Two workers on one shard whose clock the test sets: one takes 1 s per local step, the other
4 s. The shard measures that from their pushes and assigns the slow one a quarter of the window;
its procedure then pushes after that many steps.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from pstools.inprocess import InProcessService
from psworker.binding import ModelBinding
from psworker.procedures import (
    EasgdProcedure,
    Procedure,
    StepOutcome,
    WindowedDeltaProcedure,
    assigned_window,
    build_procedure,
)
from psworker.service import PushResult
from tests.psserver.core.rules.conftest import INITIAL, LAYOUT

GRADIENT = torch.tensor([0.5, -1.0, 0.25, 1.0, -0.5, 0.75])


class _Clocked:
    """A shard on a clock the test moves, and workers that take a fixed time per local step."""

    def __init__(self, rule: str, **options: str) -> None:
        self.now = 0.0
        self.shard = Shard(ShardConfig(RuleSpec.parse(rule, options)), clock_source=lambda: self.now)

    def worker(self, name: str) -> Procedure[Any]:
        client = InProcessService(self.shard, LAYOUT, name)
        client.init(INITIAL.clone())
        model = nn.Linear(2, 2)
        procedure = build_procedure(client, ModelBinding(model))
        procedure.start()
        return procedure

    def run_window(self, procedure: Procedure[Any], seconds_per_step: float, start: float) -> tuple[int, StepOutcome]:
        """Local steps from virtual time ``start`` until the procedure pushes; (steps taken, the push)."""
        model = procedure.binding.model
        for taken in range(1, 100):
            self.now = start + taken * seconds_per_step
            offset = 0
            for parameter in model.parameters():
                count = parameter.numel()
                parameter.grad = GRADIENT[offset : offset + count].reshape(parameter.shape).clone()
                offset += count
            outcome = procedure.step(0.0)
            if outcome.pushed:
                return taken, outcome
        raise AssertionError("the procedure never pushed")


@pytest.mark.parametrize("rule", ["diloco-dn", "downpour", "agn", "easgd"])
def test_the_slow_worker_follows_the_window_the_shard_assigns(rule: str) -> None:
    cluster = _Clocked(rule, window="8", dylu="true")
    fast, slow = cluster.worker("fast"), cluster.worker("slow")
    # First windows: no speed known yet, so both take H = 8 and are assigned H back.
    assert cluster.run_window(fast, 1.0, 0.0)[0] == 8  # pushes at t = 8
    taken, outcome = cluster.run_window(slow, 4.0, 0.0)  # pushes at t = 32
    assert taken == 8 and outcome.telemetry["local_steps"] == 8.0
    # Second windows: the fast worker 1 step/s (8 → 16), the slow one 0.25 (32 → 64).
    taken, outcome = cluster.run_window(fast, 1.0, 8.0)
    assert taken == 8 and outcome.telemetry["local_steps"] == 8.0
    taken, outcome = cluster.run_window(slow, 4.0, 32.0)
    assert taken == 8 and outcome.telemetry["local_steps"] == 2.0  # floor(0.25 / 1 × 8)
    assert isinstance(slow, (WindowedDeltaProcedure, EasgdProcedure)) and slow.window == 2
    # The slow worker now pushes after 2 steps, and keeps being assigned 2.
    taken, outcome = cluster.run_window(slow, 4.0, 64.0)
    assert taken == 2 and outcome.telemetry["local_steps"] == 2.0
    record = next(w for w in cluster.shard.workers.values() if w.name == "slow")
    assert record.last_telemetry["local_steps"] == 2.0


def test_without_dylu_the_window_stays_and_no_steps_are_assigned() -> None:
    cluster = _Clocked("diloco", window="4")
    fast, slow = cluster.worker("fast"), cluster.worker("slow")
    for start in (0.0, 4.0, 8.0):
        assert cluster.run_window(fast, 1.0, start)[0] == 4
    for start in (0.0, 16.0):
        taken, outcome = cluster.run_window(slow, 4.0, start)
        assert taken == 4 and "local_steps" not in outcome.telemetry


def test_the_fewest_steps_any_shard_assigns_win() -> None:
    def result(local_steps: int) -> PushResult:
        return PushResult(clock=1, staleness=0, duplicate=False, telemetry={}, local_steps=local_steps)

    assert assigned_window([result(0), result(0)]) is None  # no shard assigns (DyLU off, an old server)
    assert assigned_window([result(5), result(0), result(4)]) == 4
