from __future__ import annotations

import gzip
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from pstasks.cli import main
from pstasks.task_error import TaskError
from pstasks.tasks import digits, load_task
from psworker.task import Task, evaluate
from tests.pstasks.test_idx import write_dataset


def test_digits_is_the_bundled_data_split_80_20() -> None:
    task = digits()
    assert task.train_inputs.shape == (1437, 1, 8, 8)
    assert task.test_inputs.shape == (360, 1, 8, 8)
    assert float(task.train_inputs.max()) <= 1.0
    logits = task.build_model()(task.test_inputs[:5])
    assert logits.shape == (5, 10)


def test_an_untrained_model_is_near_chance() -> None:
    task = digits()
    accuracy, loss = evaluate(task.build_model(), task, torch.device("cpu"))
    assert accuracy < 0.3
    assert loss > 1.5


def user_task() -> Task:
    return digits(seed=3)


def test_module_function_tasks_load() -> None:
    assert load_task(f"{__name__}:user_task").name == "digits"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("mnist", "unknown task 'mnist'"),
        ("no_such_module:f", "cannot import"),
        ("json:nothing", "has no function"),
        ("json:dumps", "callable with no arguments"),
        ("json:JSONDecoder", "expected psworker.task.Task"),
    ],
)
def test_bad_task_specs_are_clear(spec: str, message: str) -> None:
    with pytest.raises(TaskError, match=message):
        load_task(spec)


# -- Fashion-MNIST tasks, on small IDX files written here (the real ones need no set-up here) --


@pytest.fixture
def fashion_dir(tmp_path: Path) -> Path:
    write_dataset(tmp_path, train=10, test=4)
    return tmp_path


@pytest.mark.parametrize(
    ("spec", "parameters"), [("fashion", (300_000, 500_000)), ("fashion-resnet18", (11e6, 11.3e6))]
)
def test_fashion_tasks_build_and_run_a_forward_pass(
    fashion_dir: Path, spec: str, parameters: tuple[float, float]
) -> None:
    task = load_task(spec, data_dir=fashion_dir)
    assert task.name == spec
    assert task.train_inputs.shape == (10, 1, 28, 28)
    assert task.disjoint_shards
    model = task.build_model()
    assert parameters[0] <= sum(p.numel() for p in model.parameters()) <= parameters[1]
    assert model(task.test_inputs).shape == (4, 10)
    accuracy, loss = evaluate(model, task, torch.device("cpu"))
    assert 0.0 <= accuracy <= 1.0 and loss > 0


def test_the_resnet_keeps_torchvision_parameter_names(fashion_dir: Path) -> None:
    names = {name for name, _ in load_task("fashion-resnet18", fashion_dir).build_model().named_parameters()}
    assert {"conv1.weight", "bn1.weight", "layer2.0.downsample.0.weight", "layer4.1.conv2.weight", "fc.bias"} <= names
    assert load_task("fashion-resnet18", fashion_dir).build_model().conv1.kernel_size == (3, 3)


def test_shards_are_disjoint_and_cover_the_training_set(fashion_dir: Path) -> None:
    task = load_task("fashion", fashion_dir)
    parts = [task.shard(index, 3) for index in range(3)]
    assert [part.train_size for part in parts] == [3, 3, 4]
    assert torch.equal(torch.cat([part.train_targets for part in parts]), task.train_targets)
    assert parts[0].test_inputs is task.test_inputs
    with pytest.raises(ValueError, match=r"index must be in 0\.\.2"):
        task.shard(3, 3)
    with pytest.raises(ValueError, match="11 data shards for 10 training examples"):
        task.shard(0, 11)


def test_digits_ignores_the_data_dir_and_does_not_shard_by_default() -> None:
    task = load_task("digits", data_dir=Path("/nonexistent"))
    assert task.train_size == 1437
    assert not task.disjoint_shards


@pytest.mark.parametrize("spec", ["fashion", "fashion-resnet18"])
def test_a_missing_data_dir_is_exit_2_with_one_line(spec: str) -> None:
    result = CliRunner().invoke(
        main, ["train", "--server", "127.0.0.1:9", "--task", spec, "--data-dir", "/nonexistent"]
    )
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("Error: /nonexistent/train-images-idx3-ubyte[.gz]: not found")
    assert "apt-get install dataset-fashion-mnist" in lines[0]


def test_a_malformed_file_is_exit_2_naming_it(fashion_dir: Path) -> None:
    (fashion_dir / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(b"\0\0\x08\x01\0\0\0\x0a\1\2"))
    result = CliRunner().invoke(
        main, ["train", "--server", "127.0.0.1:9", "--task", "fashion", "--data-dir", str(fashion_dir)]
    )
    assert result.exit_code == 2, result.output
    assert f"{fashion_dir / 'train-labels-idx1-ubyte.gz'}: truncated: 2 of the 10" in result.output


@pytest.mark.parametrize("value", ["4/4", "1", "a/b", "-1/2", "0/0"])
def test_a_wrong_shard_is_refused(value: str) -> None:
    result = CliRunner().invoke(main, ["train", "--server", "127.0.0.1:9", "--shard-data", value])
    assert result.exit_code == 2
    assert "--shard-data" in result.output and "INDEX/COUNT" in result.output, result.output


def test_more_shards_than_examples_is_refused(fashion_dir: Path) -> None:
    args = ["train", "--server", "127.0.0.1:9", "--task", "fashion", "--data-dir", str(fashion_dir)]
    result = CliRunner().invoke(main, [*args, "--shard-data", "0/11"])
    assert result.exit_code == 2
    assert "11 data shards for 10 training examples" in result.output


@pytest.mark.parametrize("command", [["cluster", "--workers", "1", "--slowdowns", "1"], ["simulate"]])
def test_cluster_and_simulate_pass_the_data_dir_and_exit_2_without_data(command: list[str]) -> None:
    from pstools.cli import main as tools_main

    result = CliRunner().invoke(tools_main, [*command, "--task", "fashion", "--data-dir", "/nonexistent"])
    assert result.exit_code == 2, result.output
    assert "Error: /nonexistent/train-images-idx3-ubyte[.gz]: not found" in result.output
    assert "apt-get install dataset-fashion-mnist" in result.output
