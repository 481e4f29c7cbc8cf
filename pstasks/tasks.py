"""The built-in tasks and how a task is found by name: a model, its data and its loss.

Built in: ``digits`` (scikit-learn's bundled 8×8 digits, no set-up), ``fashion`` (a CNN on
Fashion-MNIST), ``fashion-resnet18`` (ResNet-18 on Fashion-MNIST, about 11M parameters),
``tinylm`` (a byte-level transformer on Python's own pydoc text) and ``gpt2-small`` (GPT-2
small's shape, 124M parameters, on the same bytes; :mod:`pstasks.tinylm`); the Fashion-MNIST
files are read from a data directory (:mod:`pstasks.fashion`). Each task names its
:class:`~psworker.task.Metric`: test accuracy for the classifiers, validation loss for the
language models. A user task is any ``module:function`` returning a :class:`~psworker.task.Task`;
nothing is downloaded at run time. A run may change a task's batch size and, for a language
model, its windows' length (:class:`TaskOptions`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from pstasks.digits import load_digits, stratified_split
from pstasks.task_error import TaskError
from psworker.task import Task


class DigitsCNN(nn.Module):
    """A small CNN for 8×8 digit images (about 40k parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))  # type: ignore[no-any-return]


def digits(seed: int = 0, data_dir: Path | None = None) -> Task:
    """scikit-learn's bundled handwritten digits (1,797 8×8 images), 80/20 stratified split.

    ``data_dir`` is ignored: the data ships inside scikit-learn."""
    pixels, targets = load_digits()
    images = torch.tensor(pixels, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(targets, dtype=torch.long)
    train_idx, test_idx = (torch.from_numpy(part) for part in stratified_split(targets, 0.2, seed))
    model_seed = seed

    def build() -> nn.Module:
        torch.manual_seed(model_seed)
        return DigitsCNN()

    return Task(
        name="digits",
        build_model=build,
        train_inputs=images[train_idx],
        train_targets=labels[train_idx],
        test_inputs=images[test_idx],
        test_targets=labels[test_idx],
    )


def _fashion_task(name: str, model: Callable[[], nn.Module], seed: int, data_dir: Path | None) -> Task:
    """Fashion-MNIST (60,000 training, 10,000 test images) for ``model``, seeded; batches of 64,
    each worker on its own part."""
    from pstasks.fashion import load_fashion

    data = load_fashion(data_dir)

    def build() -> nn.Module:
        torch.manual_seed(seed)
        return model()

    return Task(
        name,
        build,
        data.train_inputs,
        data.train_targets,
        data.test_inputs,
        data.test_targets,
        batch_size=64,
        disjoint_shards=True,
    )


def fashion(seed: int = 0, data_dir: Path | None = None) -> Task:
    """Fashion-MNIST and a ~420k-parameter CNN."""
    from pstasks.fashion import FashionCNN

    return _fashion_task("fashion", FashionCNN, seed, data_dir)


def fashion_resnet18(seed: int = 0, data_dir: Path | None = None) -> Task:
    """Fashion-MNIST and ResNet-18 adapted to 1×28×28 (about 11M parameters)."""
    from pstasks.models.resnet import ResNet18

    return _fashion_task("fashion-resnet18", lambda: ResNet18(in_channels=1, num_classes=10), seed, data_dir)


class TaskFactory(Protocol):
    def __call__(self, seed: int = 0, data_dir: Path | None = None) -> Task: ...


class LanguageModelFactory(Protocol):
    def __call__(self, seed: int = 0, data_dir: Path | None = None, sequence_length: int | None = None) -> Task: ...


def tinylm(seed: int = 0, data_dir: Path | None = None, sequence_length: int | None = None) -> Task:
    """A ~0.86M-parameter byte-level transformer on the pydoc topics text (:mod:`pstasks.tinylm`)."""
    from pstasks.tinylm import tinylm as build_tinylm

    return build_tinylm(seed, data_dir, sequence_length)


def gpt2_small(seed: int = 0, data_dir: Path | None = None, sequence_length: int | None = None) -> Task:
    """GPT-2 small's shape (124,439,808 parameters) on the same bytes as tinylm (:mod:`pstasks.tinylm`)."""
    from pstasks.tinylm import gpt2_small as build_gpt2_small

    return build_gpt2_small(seed, data_dir, sequence_length)


LANGUAGE_MODELS: dict[str, LanguageModelFactory] = {"tinylm": tinylm, "gpt2-small": gpt2_small}
BUILTIN_TASKS: dict[str, TaskFactory] = {
    "digits": digits,
    "fashion": fashion,
    "fashion-resnet18": fashion_resnet18,
    **LANGUAGE_MODELS,
}


@dataclass(frozen=True)
class TaskOptions:
    """What a run changes of its task (``psworker train --config``'s ``[task_options]`` table)."""

    # Examples per step ("auto": the task's own: 32 for digits and tinylm, 64 for Fashion-MNIST,
    # 8 windows of 1,024 bytes for gpt2-small).
    batch_size: int | None = None
    # Bytes per window of a language-model task (tinylm, gpt2-small), at most its context ("auto":
    # the context, 32 for tinylm and 1,024 for gpt2-small); shorter windows make a CPU step cheap.
    sequence_length: int | None = None

    def __post_init__(self) -> None:
        for key, value in (("batch_size", self.batch_size), ("sequence_length", self.sequence_length)):
            if value is not None and value < 1:
                raise ValueError(f"{key} must be at least 1, not {value}")


def load_task(spec: str, data_dir: Path | None = None, options: TaskOptions = TaskOptions()) -> Task:
    """A built-in task by name, or ``module:function`` returning a Task, with ``options`` applied.

    ``data_dir`` is where built-in tasks read data files from (see :mod:`pstasks.fashion`);
    a missing or malformed file raises :class:`pstasks.idx.IdxError`."""
    if spec in LANGUAGE_MODELS:
        task = LANGUAGE_MODELS[spec](data_dir=data_dir, sequence_length=options.sequence_length)
    elif options.sequence_length is not None:
        raise TaskError(
            f"sequence_length is an option of the language-model tasks ({', '.join(LANGUAGE_MODELS)}), not of {spec}"
        )
    else:
        task = _task(spec, data_dir)
    return task if options.batch_size is None else replace(task, batch_size=options.batch_size)


def _task(spec: str, data_dir: Path | None) -> Task:
    """The task ``spec`` names, as its factory builds it."""
    if spec in BUILTIN_TASKS:
        return BUILTIN_TASKS[spec](data_dir=data_dir)
    module_name, sep, function_name = spec.partition(":")
    if not sep:
        raise TaskError(f"unknown task {spec!r}; built-in tasks: {', '.join(BUILTIN_TASKS)}, or give module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise TaskError(f"cannot import {module_name!r} for task {spec!r}: {error}") from None
    factory = getattr(module, function_name, None)
    if not callable(factory):
        raise TaskError(f"{module_name} has no function {function_name!r}")
    try:
        task = factory()
    except TypeError as error:
        raise TaskError(f"{spec} must be callable with no arguments: {error}") from None
    if not isinstance(task, Task):
        raise TaskError(f"{spec} returned {type(task).__name__}, expected psworker.task.Task")
    return task
