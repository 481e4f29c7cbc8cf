"""Training tasks: a model, its data and its loss. Built in: ``digits``; users pass ``module:function``.

A user task is any function returning a :class:`Task`; nothing is downloaded at run time.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional


@dataclass
class Task:
    """What a worker trains: a model factory, tensors of training and test data, a loss."""

    name: str
    build_model: Callable[[], nn.Module]
    train_inputs: torch.Tensor
    train_targets: torch.Tensor
    test_inputs: torch.Tensor
    test_targets: torch.Tensor
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = functional.cross_entropy
    batch_size: int = 32

    @property
    def train_size(self) -> int:
        return int(self.train_inputs.shape[0])


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


def digits(seed: int = 0) -> Task:
    """scikit-learn's bundled handwritten digits (1,797 8×8 images), 80/20 stratified split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    images = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(data.target, dtype=torch.long)
    train_idx, test_idx = train_test_split(range(len(labels)), test_size=0.2, random_state=seed, stratify=data.target)
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


BUILTIN_TASKS: dict[str, Callable[[], Task]] = {"digits": digits}


class TaskError(ValueError):
    """A task name or ``module:function`` that cannot be loaded."""


def load_task(spec: str) -> Task:
    """A built-in task by name, or ``module:function`` returning a Task."""
    if spec in BUILTIN_TASKS:
        return BUILTIN_TASKS[spec]()
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
        raise TaskError(f"{spec} returned {type(task).__name__}, expected psworker.tasks.Task")
    return task


@torch.no_grad()
def evaluate(model: nn.Module, task: Task, device: torch.device) -> tuple[float, float]:
    """(test accuracy, mean test loss) of ``model`` on the task's test set."""
    model.eval()
    correct = 0
    loss_sum = 0.0
    for start in range(0, task.test_inputs.shape[0], 512):
        x = task.test_inputs[start : start + 512].to(device)
        y = task.test_targets[start : start + 512].to(device)
        logits = model(x)
        loss_sum += float(task.loss(logits, y)) * y.shape[0]
        correct += int((logits.argmax(dim=1) == y).sum())
    model.train()
    count = task.test_inputs.shape[0]
    return correct / count, loss_sum / count
