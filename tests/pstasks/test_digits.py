"""The digits read and split without scikit-learn equal scikit-learn's own, seed for seed."""

from __future__ import annotations

from importlib.machinery import ModuleSpec
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from sklearn.datasets import load_digits as sklearn_load_digits
from sklearn.model_selection import train_test_split

from pstasks import digits
from pstasks.cli import main
from pstasks.digits import DigitsDataError, load_digits, stratified_split
from pstasks.task_error import TaskError
from pstasks.tasks import load_task


def test_the_data_is_scikit_learns() -> None:
    images, labels = load_digits()
    expected = sklearn_load_digits()
    assert images.shape == (1797, 8, 8)
    np.testing.assert_array_equal(images, expected.images)
    np.testing.assert_array_equal(labels, expected.target)


@pytest.mark.parametrize("seed", [0, 1, 2, 7, 42, 1234])
def test_the_split_is_train_test_splits(seed: int) -> None:
    _, labels = load_digits()
    train, test = stratified_split(labels, 0.2, seed)
    expected_train, expected_test = train_test_split(
        range(len(labels)), test_size=0.2, random_state=seed, stratify=labels
    )
    assert train.tolist() == list(expected_train)
    assert test.tolist() == list(expected_test)


@pytest.mark.parametrize("seed", [0, 3, 11])
@pytest.mark.parametrize("test_size", [0.2, 0.25, 0.5])
def test_uneven_classes_break_ties_as_scikit_learn_does(seed: int, test_size: float) -> None:
    # Class sizes whose shares leave equal remainders, so the random tie-breaking is exercised.
    labels = np.repeat(np.arange(5), [7, 7, 3, 3, 10]).astype(np.int64)
    train, test = stratified_split(labels, test_size, seed)
    expected_train, expected_test = train_test_split(
        range(len(labels)), test_size=test_size, random_state=seed, stratify=labels
    )
    assert train.tolist() == list(expected_train)
    assert test.tolist() == list(expected_test)
    assert sorted(train.tolist() + test.tolist()) == list(range(len(labels)))


def test_the_digits_task_is_unchanged() -> None:
    task = load_task("digits")
    expected = sklearn_load_digits()
    train, test = train_test_split(range(1797), test_size=0.2, random_state=0, stratify=expected.target)
    np.testing.assert_array_equal(task.train_targets.numpy(), expected.target[train])
    np.testing.assert_array_equal(task.test_targets.numpy(), expected.target[test])
    np.testing.assert_allclose(task.train_inputs.numpy()[:, 0], expected.images[train] / 16.0, rtol=0, atol=1e-7)


def test_without_scikit_learn_the_task_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(digits, "find_spec", lambda name: None)
    with pytest.raises(TaskError, match=r"pip install .hetps\[tasks\]. \(or scikit-learn\)"):
        load_task("digits")


def test_a_missing_data_file_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    spec = ModuleSpec("sklearn", None, is_package=True)
    spec.submodule_search_locations = [str(tmp_path)]
    monkeypatch.setattr(digits, "find_spec", lambda name: spec)
    with pytest.raises(DigitsDataError, match=r"digits\.csv\.gz is missing"):
        load_task("digits")


def test_psworker_train_without_scikit_learn_exits_2_naming_the_task_option(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(digits, "find_spec", lambda name: None)
    result = CliRunner().invoke(main, ["train", "--server", "127.0.0.1:9", "--task", "digits"])
    assert result.exit_code == 2
    assert "--task" in result.output and "pip install 'hetps[tasks]'" in result.output
