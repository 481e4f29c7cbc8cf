"""scikit-learn's bundled handwritten digits and their stratified split, without importing scikit-learn.

Importing scikit-learn (and the SciPy it brings) cost a worker process about 1.4 s of CPU at
start, nearly as much as importing torch (``python -m benchmarks.start_up``), and a local cluster
starts one such process per worker.
The data is one CSV file inside the installed package, and the split is scikit-learn's
``train_test_split(..., stratify=labels, random_state=seed)`` step for step, so a given seed
selects the same examples as it (``tests/pstasks/test_digits.py`` compares the two).
"""

from __future__ import annotations

import gzip
import math
from importlib.util import find_spec
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from pstasks.task_error import TaskError


class DigitsDataError(TaskError):
    """scikit-learn, which ships the digits, is not installed or lacks the data file."""


def digits_file() -> Path:
    """Where scikit-learn keeps the digits (``sklearn/datasets/data/digits.csv.gz``); found, not imported."""
    spec = find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DigitsDataError(
            "the digits task reads its data from scikit-learn: pip install 'hetps[tasks]' (or scikit-learn)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    if not path.is_file():
        raise DigitsDataError(f"scikit-learn is installed without its digits data: {path} is missing")
    return path


def load_digits() -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """The 1,797 images (8×8, values 0–16) and their labels, as ``sklearn.datasets.load_digits`` reads them."""
    with gzip.open(digits_file(), "rt") as text:
        data = np.loadtxt(text, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(np.int64)


def stratified_split(
    labels: NDArray[np.int64], test_size: float, seed: int
) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    """(train, test) indices: ``sklearn.model_selection.train_test_split(range(n), test_size=test_size,
    random_state=seed, stratify=labels)``, whose ``StratifiedShuffleSplit`` draws each class's share of
    both sets from one ``numpy.random.RandomState(seed)`` in this order."""
    n_test = math.ceil(test_size * len(labels))
    n_train = len(labels) - n_test
    _, label_indices, class_counts = np.unique(labels, return_inverse=True, return_counts=True)
    class_members = np.split(np.argsort(label_indices, kind="stable"), np.cumsum(class_counts)[:-1])
    rng = np.random.RandomState(seed)
    train_counts = _approximate_mode(class_counts, n_train, rng)
    test_counts = _approximate_mode(class_counts - train_counts, n_test, rng)
    train: list[np.intp] = []
    test: list[np.intp] = []
    for members, count, in_train, in_test in zip(class_members, class_counts, train_counts, test_counts, strict=True):
        shuffled = members.take(rng.permutation(count), mode="clip")
        train.extend(shuffled[:in_train])
        test.extend(shuffled[in_train : in_train + in_test])
    return rng.permutation(train), rng.permutation(test)


def _approximate_mode(class_counts: NDArray[np.int64], draws: int, rng: np.random.RandomState) -> NDArray[np.int64]:
    """How many of ``draws`` each class gets: its share rounded down, then one more for the classes
    with the largest remainders, ties broken at random (scikit-learn's ``_approximate_mode``)."""
    continuous = class_counts / class_counts.sum() * draws
    floored = np.floor(continuous)
    need_to_add = int(draws - floored.sum())
    if need_to_add > 0:
        remainder = continuous - floored
        for value in np.sort(np.unique(remainder))[::-1]:
            (tied,) = np.where(remainder == value)
            add_now = min(len(tied), need_to_add)
            floored[rng.choice(tied, size=add_now, replace=False)] += 1
            need_to_add -= add_now
            if need_to_add == 0:
                break
    counts: NDArray[np.int64] = floored.astype(np.int64)
    return counts
