"""The simulator: deterministic for a seed, exact delays and staleness, consistency models, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from pstools.cli import main
from pstools.simulate import SimConfig, SimulationError, SpeedModel, load_profile, simulate

MLP = "digits-mlp"


def _run(**fields: object) -> dict[str, object]:
    config = SimConfig(**{"task": MLP, "steps": 60, "eval_every": 20, **fields})  # type: ignore[arg-type]
    data = simulate(config).to_json()
    data.pop("wall_s")
    return data


def test_deterministic_for_a_seed() -> None:
    config = {"rule": "gap-aware", "options": {"lr": "0.1"}, "workers": 5, "speeds": SpeedModel.parse("exp:1:2")}
    first, second = _run(**config, seed=3), _run(**config, seed=3)
    assert first == second
    assert _run(**config, seed=4)["pushes"] != first["pushes"]


@pytest.mark.parametrize("delay", [0, 1, 5])
def test_constant_delay_applies_every_gradient_exactly_d_late(delay: int) -> None:
    result = simulate(SimConfig(rule="momentum", options={"lr": "0.02"}, delay=delay, task=MLP, steps=40))
    assert result.staleness_histogram == {delay: 40}
    # The D zero-gradient pads move the clock too.
    assert result.clock == 40 + delay


def test_round_robin_equal_speeds_give_n_minus_one() -> None:
    n = 6
    result = simulate(SimConfig(rule="asgd", options={"lr": "0.05"}, workers=n, task=MLP, steps=60))
    taus = [tau for _, _, tau in result.pushes]
    assert taus[:n] == list(range(n))  # everyone pulled clock 0
    assert set(taus[n:]) == {n - 1}
    assert [rank for _, rank, _ in result.pushes[: 2 * n]] == list(range(n)) * 2


def test_speed_groups_make_slow_workers_staler() -> None:
    result = simulate(
        SimConfig(rule="sa", options={"lr": "0.1"}, workers=4, speeds=SpeedModel.parse("1:1:2:4"), task=MLP, steps=70)
    )
    steps = [w.steps for w in result.workers]
    assert steps[0] == steps[1] > steps[2] > steps[3]
    assert result.workers[3].mean_staleness > result.workers[0].mean_staleness
    assert result.virtual_s == pytest.approx(result.pushes[-1][0])


def test_ssp_bound_zero_is_lock_step() -> None:
    result = simulate(
        SimConfig(
            rule="asgd",
            options={"lr": "0.05"},
            workers=3,
            speeds=SpeedModel.parse("1:2:4"),
            consistency="ssp",
            ssp_bound=0,
            task=MLP,
            steps=30,
        )
    )
    counts = [0, 0, 0]
    for _, rank, _ in result.pushes:
        counts[rank] += 1
        assert max(counts) - min(counts) <= 1
    assert [w.steps for w in result.workers] == [10, 10, 10]
    assert result.workers[0].parked_s > 0


def test_bsp_applies_one_mean_per_round_at_the_slowest_speed() -> None:
    result = simulate(
        SimConfig(
            rule="momentum",
            options={"lr": "0.05"},
            workers=4,
            speeds=SpeedModel.parse("1:1:2:4"),
            consistency="bsp",
            task=MLP,
            steps=40,
        )
    )
    assert result.clock == 10
    assert result.staleness_histogram == {0: 40}
    assert result.virtual_s == pytest.approx(40.0)


@pytest.mark.parametrize(
    ("rule", "options"),
    [
        ("gem", {"lr": "0.05"}),
        ("agn", {"lr": "0.002", "window": "4"}),
        ("easgd", {"lr": "0.05", "window": "4"}),
        ("dynsgd", {"lr": "0.05", "window": "3"}),
        ("ormo", {"lr": "0.02"}),
    ],
)
def test_worker_procedures_run_unchanged(rule: str, options: dict[str, str]) -> None:
    result = simulate(SimConfig(rule=rule, options=options, workers=3, task=MLP, steps=48, eval_every=48))
    assert result.steps == 48 and not result.diverged
    assert result.test_loss < 10
    if rule == "gem":
        assert "pi_median" in result.telemetry
    if rule in {"agn", "easgd"}:
        assert result.clock == 12  # one push per window of 4


def test_divergence_is_reported_not_raised() -> None:
    result = simulate(SimConfig(rule="asgd", options={"lr": "50"}, workers=8, task=MLP, steps=200, eval_every=50))
    assert result.diverged and result.test_accuracy == 0.0


def test_time_to_target_and_stop() -> None:
    result = simulate(
        SimConfig(
            rule="asgd",
            options={"lr": "0.1"},
            task=MLP,
            steps=2000,
            eval_every=25,
            target=0.5,
            stop_at_target=True,
        )
    )
    assert result.time_to_target_s is not None and result.steps < 2000
    assert result.curve[-1].test_accuracy >= 0.5


def test_profile_from_a_real_runs_logs(tmp_path: Path) -> None:
    lines = [{"event": "step", "step": 10 * i, "time": 0.5 * i} for i in range(1, 5)]
    (tmp_path / "worker-0.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    (tmp_path / "worker-1.jsonl").write_text(json.dumps({"event": "done", "compute_seconds_per_step": 0.2}))
    profile = load_profile(tmp_path)
    assert profile == ((0.05, 0.05, 0.05), (0.2,))
    speeds = SpeedModel.parse(f"profile:{tmp_path}")
    result = simulate(SimConfig(rule="asgd", options={"lr": "0.05"}, workers=2, speeds=speeds, task=MLP, steps=25))
    assert result.workers[0].steps == 20 and result.workers[1].steps == 5


def test_bad_configurations_are_refused() -> None:
    with pytest.raises(SimulationError):
        SpeedModel.parse("1:x")
    with pytest.raises(SimulationError):
        simulate(SimConfig(rule="gem", consistency="bsp", task=MLP, steps=4))
    with pytest.raises(SimulationError):
        simulate(SimConfig(rule="agn", delay=3, task=MLP, steps=4))


def test_cli_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    result = CliRunner().invoke(
        main,
        [
            "simulate",
            "--workers",
            "4",
            "--speeds",
            "1:1:2:4",
            "--rule",
            "sa",
            "--lr",
            "0.1",
            "--task",
            MLP,
            "--steps",
            "40",
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "test accuracy" in result.output
    data = json.loads(out.read_text())
    assert data["steps"] == 40 and data["config"]["rule"] == "sa"
    bad = CliRunner().invoke(main, ["simulate", "--rule", "nope"])
    assert bad.exit_code == 2 and "unknown rule" in bad.output


def test_cli_passes_int8_pushes_without_error_feedback_to_the_simulation(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    arguments = ["simulate", "--rule", "asgd", "--lr", "0.1", "--task", MLP, "--steps", "8", "--json", str(out)]
    settings = tmp_path / "sim.toml"
    settings.write_text("error_feedback = false\nseed = 4\n")
    result = CliRunner().invoke(main, [*arguments, "--push-dtype", "int8", "--config", str(settings)])
    assert result.exit_code == 0, result.output
    config = json.loads(out.read_text())["config"]
    assert (config["push_dtype"], config["error_feedback"], config["seed"]) == ("int8", False, 4)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("sed = 1\n", "unknown key sed"),
        ("eval_every = 'often'\n", "eval_every must be a whole number"),
        ("ssp_bound = -1\n", "ssp_bound must be 0 or more, not -1"),
        ("step_seconds = 0\n", "step_seconds must be positive, not 0"),
    ],
)
def test_a_wrong_simulate_file_exits_2_naming_the_key(tmp_path: Path, text: str, says: str) -> None:
    settings = tmp_path / "sim.toml"
    settings.write_text(text)
    result = CliRunner().invoke(main, ["simulate", "--steps", "8", "--config", str(settings)])
    assert result.exit_code == 2 and "--config" in result.output and says in result.output, result.output


def test_simulate_shows_at_most_16_options() -> None:
    from pstools.sim_cli import simulate_command

    assert len([param for param in simulate_command.params if param.name != "help"]) <= 16
