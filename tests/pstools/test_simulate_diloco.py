"""``psworker simulate`` runs both DiLoCo rules end to end on digits, DyLU, and synchronous DiLoCo (BSP)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from pstools.cli import main
from pstools.simulate import SimConfig, Simulation, SimulationError, SpeedModel, simulate


@pytest.mark.parametrize("rule", ["diloco", "diloco-dn"])
def test_simulate_runs_and_learns(rule: str, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    settings = tmp_path / "sim.toml"
    settings.write_text("eval_every = 600\n")
    args = ["simulate", "--rule", rule, "--rule-opt", "window=10", "--workers", "2", "--speeds", "1:2"]
    args += ["--task", "digits-mlp", "--steps", "600", "--config", str(settings), "--json", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["clock"] == 60  # one push per window of 10 steps
    assert not data["diverged"] and data["test_accuracy"] > 0.5  # chance is 0.1
    if rule == "diloco-dn":
        assert data["telemetry"]["momentum_step"] == pytest.approx(0.25)  # one push in period=4 closes it


def test_dylu_gives_slow_workers_fewer_local_steps() -> None:
    # diloco-dn with DyLU on 1:1:2:4 (period = the worker count): after each worker's first two
    # windows the shard knows its speed and assigns H, H, H/2, H/4.
    result = simulate(
        SimConfig(
            rule="diloco-dn",
            options={"window": "8", "dylu": "true", "period": "4"},
            workers=4,
            speeds=SpeedModel.parse("1:1:2:4"),
            task="digits-mlp",
            steps=480,
            eval_every=480,
        )
    )
    assert [w.local_steps for w in result.workers] == [8, 8, 4, 2]
    per_push = [w.steps_per_push for w in result.workers]
    assert per_push[0] == per_push[1] == 8.0  # the fastest keep the rule's window
    assert 8.0 > per_push[2] > per_push[3]  # the slower a worker, the fewer steps per push
    assert per_push[3] < 3.0  # mostly windows of 2, after two of 8
    # Every worker pushes about as often as the others now: their push counts stay within 2×.
    pushes = [w.pushes for w in result.workers]
    assert max(pushes) < 2 * min(pushes)
    assert not result.diverged and result.telemetry["local_steps"] < 8.0


def test_without_dylu_every_worker_keeps_the_window() -> None:
    config = SimConfig(rule="diloco-dn", options={"window": "8"}, workers=4, speeds=SpeedModel.parse("1:1:2:4"))
    result = simulate(replace(config, task="digits-mlp", steps=240, eval_every=240))
    assert all(w.local_steps == 0 and w.steps_per_push == 8.0 for w in result.workers)


def test_synchronous_diloco_runs_under_bsp() -> None:
    # One round: every worker takes its window of 5 local steps, the slowest (4×) sets the round's time.
    result = simulate(
        SimConfig(
            rule="diloco",
            options={"window": "5"},
            workers=4,
            speeds=SpeedModel.parse("1:1:2:4"),
            consistency="bsp",
            task="digits-mlp",
            steps=60,
            eval_every=60,
        )
    )
    assert result.clock == 3  # 60 steps = 3 rounds of 4 workers × 5 steps, one averaged outer step each
    assert [w.steps_per_push for w in result.workers] == [5.0] * 4
    assert result.staleness_histogram == {0: 12}
    assert result.virtual_s == pytest.approx(3 * 5 * 4.0)
    assert not result.diverged


def test_dylu_under_bsp_and_bsp_for_easgd_are_refused() -> None:
    with pytest.raises(SimulationError, match="DyLU"):
        Simulation(SimConfig(rule="diloco", options={"dylu": "true"}, consistency="bsp", task="digits-mlp"))
    with pytest.raises(SimulationError, match="BSP is simulated for the gradient, delta, agn and diloco"):
        Simulation(SimConfig(rule="easgd", consistency="bsp", task="digits-mlp"))


def test_lockstep_delayed_nesterov_with_pull_grace_is_synchronous_diloco() -> None:
    # Equal speeds: the four pushes of a round land together. With pull_grace each worker's pull
    # waits for the push that closes the period, so every window starts from the parameters after
    # the momentum step, and N pushes at ε/N plus one Nesterov step on their mean are sync DiLoCo.
    base = SimConfig(
        rule="diloco-dn",
        options={"window": "5", "period": "4", "pull_grace": "0.5"},
        workers=4,
        speeds=SpeedModel.parse("1:1:1:1"),
        task="digits-mlp",
        steps=200,
        eval_every=200,
    )
    held = simulate(base)
    sync = simulate(replace(base, rule="diloco", options={"window": "5"}, consistency="bsp"))
    immediate = simulate(replace(base, options={"window": "5", "period": "4"}))
    assert held.test_loss == sync.test_loss and held.test_accuracy == sync.test_accuracy
    assert immediate.test_loss != sync.test_loss  # pulling right after one's own push is not sync DiLoCo
    assert all(w.parked_s == 0.0 for w in held.workers)  # the closing push comes at the same instant


def test_held_pulls_wait_at_most_the_grace_when_step_times_vary() -> None:
    # Random step times: the shard's pace estimates are often wrong, so some holds wait for a
    # push that does not come within the grace and end when it runs out (virtual time moves there).
    result = simulate(
        SimConfig(
            rule="diloco-dn",
            options={"window": "4", "period": "2", "pull_grace": "0.5"},
            workers=2,
            speeds=SpeedModel.parse("exp:1:1"),
            task="digits-mlp",
            steps=400,
            eval_every=400,
        )
    )
    parked = [w.parked_s for w in result.workers]
    assert sum(parked) > 0
    assert all(w.parked_s <= 0.5 * w.pushes for w in result.workers)
    assert result.clock == sum(w.pushes for w in result.workers) and not result.diverged


def test_pull_grace_under_bsp_is_refused() -> None:
    config = SimConfig(rule="diloco-dn", options={"pull_grace": "1"}, consistency="bsp", task="digits-mlp")
    with pytest.raises(SimulationError, match="pull_grace is for asynchronous training"):
        Simulation(config)
