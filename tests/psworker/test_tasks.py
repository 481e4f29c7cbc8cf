from __future__ import annotations

import pytest
import torch

from psworker.tasks import Task, TaskError, digits, evaluate, load_task


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
        ("json:JSONDecoder", "expected psworker.tasks.Task"),
    ],
)
def test_bad_task_specs_are_clear(spec: str, message: str) -> None:
    with pytest.raises(TaskError, match=message):
        load_task(spec)
