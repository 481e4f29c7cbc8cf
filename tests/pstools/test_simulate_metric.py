"""The simulator follows the task's metric: a lower-is-better loss target, what it prints, and refusals."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from click.testing import CliRunner

from pstools.cli import main
from pstools.sim_tasks import digits_mlp
from pstools.simulate import SimConfig, simulate
from psworker.task import LOSS, Task


def loss_mlp() -> Task:
    """The digits MLP judged by its test loss, as a language model is (a task for ``--task``)."""
    return replace(digits_mlp(), metric=LOSS)


def _config(target: float | None, steps: int = 300) -> SimConfig:
    options = {"lr": "0.1"}
    return SimConfig(rule="asgd", options=options, task="digits-mlp", steps=steps, eval_every=25, target=target)


def test_a_loss_target_is_reached_when_the_loss_falls_to_it() -> None:
    result = simulate(replace(_config(1.5), stop_at_target=True), loss_mlp())
    assert result.metric == "loss" and not result.higher_is_better
    assert result.time_to_target_s is not None and result.steps < 300
    # Stopped at the first evaluation at or below the target, none before it.
    assert result.curve[-1].test_loss <= 1.5
    assert len(result.curve) > 1 and all(point.test_loss > 1.5 for point in result.curve[:-1])
    assert result.metric_value == result.test_loss


def test_a_loss_target_below_what_training_reaches_is_never_reached() -> None:
    result = simulate(_config(0.001, steps=100), loss_mlp())
    assert result.time_to_target_s is None and result.steps == 100
    # The same number read as an accuracy would be reached at the first evaluation.
    accuracy = simulate(_config(0.001, steps=50))
    assert accuracy.metric == "accuracy" and accuracy.time_to_target_s is not None


def test_a_diverged_run_has_the_worst_loss() -> None:
    config = SimConfig(rule="asgd", options={"lr": "50"}, workers=8, task="digits-mlp", steps=200, eval_every=50)
    result = simulate(config, loss_mlp())
    assert result.diverged and math.isinf(result.metric_value)


def test_the_cli_prints_validation_loss_and_perplexity(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    args = ["simulate", "--task", f"{__name__}:loss_mlp", "--rule", "asgd", "--lr", "0.1", "--steps", "200"]
    settings = tmp_path / "sim.toml"
    settings.write_text("eval_every = 20\n")
    result = CliRunner().invoke(main, [*args, "--config", str(settings), "--target", "1.5", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "validation loss" in result.output and "perplexity" in result.output
    assert "reached validation loss 1.5" in result.output
    data = json.loads(out.read_text())
    assert data["metric"] == "loss" and data["config"]["target"] == 1.5


def test_a_target_accuracy_for_a_loss_task_and_both_targets_are_refused() -> None:
    base = ["simulate", "--task", f"{__name__}:loss_mlp", "--steps", "10"]
    wrong = CliRunner().invoke(main, [*base, "--target-accuracy", "0.5"])
    assert wrong.exit_code == 2 and "not accuracy; give --target" in wrong.output
    both = CliRunner().invoke(main, ["simulate", "--steps", "10", "--target", "0.5", "--target-accuracy", "0.5"])
    assert both.exit_code == 2 and "not both" in both.output
    unknown = CliRunner().invoke(main, ["simulate", "--task", "nope", "--steps", "10"])
    assert unknown.exit_code == 2 and "unknown task" in unknown.output
