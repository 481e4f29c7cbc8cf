"""Training tasks: a model, its data and its loss; users pass ``module:function``.

Built in: ``digits`` (scikit-learn's bundled 8×8 digits, no set-up), ``fashion`` (a CNN on
Fashion-MNIST), ``fashion-resnet18`` (ResNet-18 on Fashion-MNIST, about 11M parameters) and
``tinylm`` (a byte-level transformer on Python's own pydoc text, :mod:`psworker.tinylm`);
the Fashion-MNIST files are read from a data directory (:mod:`psworker.fashion`). Each task
names its :class:`Metric`: test accuracy for the classifiers, validation loss for ``tinylm``. A user task
is any function returning a :class:`Task`; nothing is downloaded at run time.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import torch
from torch import nn
from torch.nn import functional

from psworker.digits import load_digits, stratified_split
from psworker.task_error import TaskError


@dataclass(frozen=True)
class Metric:
    """What a task's evaluation is judged by: accuracy (higher is better) or loss (lower is better).

    :func:`evaluate` measures both on the test set; ``name`` says which one is the task's metric,
    the one targets, "time to target" and comparisons between runs read.
    """

    name: str
    higher_is_better: bool
    label: str  # how reports name it, e.g. "test accuracy" or "validation loss"

    def of(self, accuracy: float, loss: float) -> float:
        """This metric's value among an evaluation's (accuracy, loss)."""
        return accuracy if self.name == "accuracy" else loss

    def reached(self, value: float, target: float) -> bool:
        """Whether ``value`` is at the target: at least it (higher is better) or at most it."""
        return value >= target if self.higher_is_better else value <= target

    def better(self, a: float, b: float) -> bool:
        """Whether ``a`` is strictly better than ``b``."""
        return a > b if self.higher_is_better else a < b

    @property
    def worst(self) -> float:
        """The value of a diverged model: accuracy 0, an infinite loss."""
        return 0.0 if self.higher_is_better else math.inf

    def describe(self, accuracy: float, loss: float) -> str:
        """``test accuracy 0.9700 (loss 0.0824)`` or ``validation loss 1.8000 (perplexity 6.05)``."""
        if self.name == "accuracy":
            return f"{self.label} {accuracy:.4f} (loss {loss:.4f})"
        return f"{self.label} {loss:.4f} (perplexity {perplexity(loss):.2f})"


def perplexity(loss: float) -> float:
    """``exp(loss)`` of a mean cross-entropy; infinite for a diverged (infinite, NaN or huge) loss."""
    return math.exp(loss) if math.isfinite(loss) and loss < 700 else math.inf


ACCURACY = Metric("accuracy", True, "test accuracy")
LOSS = Metric("loss", False, "validation loss")
METRICS = {m.name: m for m in (ACCURACY, LOSS)}


def metric_named(name: str) -> Metric:
    """The metric called ``name``; ValueError naming the known ones otherwise."""
    if name not in METRICS:
        raise ValueError(f"unknown metric {name!r}; known metrics: {', '.join(METRICS)}")
    return METRICS[name]


# Builds a task's own optimizer over the model's parameters (e.g. AdamW for a language model).
OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


@dataclass
class Task:
    """What a worker trains: a model factory, tensors of training and test data, a loss.

    ``build_optimizer`` is the task's own inner optimizer for procedures that take local steps
    with it (``diloco``); its state stays on the worker. None: plain SGD at the rule's local rate.
    """

    name: str
    build_model: Callable[[], nn.Module]
    train_inputs: torch.Tensor
    train_targets: torch.Tensor
    test_inputs: torch.Tensor
    test_targets: torch.Tensor
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = functional.cross_entropy
    batch_size: int = 32
    # Whether workers of a cluster read disjoint parts of the training set unless told otherwise.
    disjoint_shards: bool = False
    build_optimizer: OptimizerFactory | None = None
    # What its evaluation is judged by (and which way is better).
    metric: Metric = ACCURACY

    @property
    def train_size(self) -> int:
        return int(self.train_inputs.shape[0])

    def shard(self, index: int, count: int) -> Task:
        """This task with only part ``index`` of ``count`` (contiguous, near-equal) of the training set."""
        if not 0 <= index < count:
            raise ValueError(f"data shard {index}/{count}: the index must be in 0..{count - 1}")
        if count > self.train_size:
            raise ValueError(f"{count} data shards for {self.train_size} training examples of {self.name}")
        start = index * self.train_size // count
        end = (index + 1) * self.train_size // count
        return replace(
            self,
            train_inputs=self.train_inputs[start:end].clone(),
            train_targets=self.train_targets[start:end].clone(),
        )


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


def fashion(seed: int = 0, data_dir: Path | None = None) -> Task:
    """Fashion-MNIST (60,000 training, 10,000 test images) and a ~420k-parameter CNN."""
    from psworker.fashion import FashionCNN, load_fashion

    data = load_fashion(data_dir)

    def build() -> nn.Module:
        torch.manual_seed(seed)
        return FashionCNN()

    return Task(
        "fashion",
        build,
        data.train_inputs,
        data.train_targets,
        data.test_inputs,
        data.test_targets,
        batch_size=64,
        disjoint_shards=True,
    )


def fashion_resnet18(seed: int = 0, data_dir: Path | None = None) -> Task:
    """Fashion-MNIST and ResNet-18 adapted to 1×28×28 (about 11M parameters)."""
    from psworker.fashion import load_fashion
    from psworker.models.resnet import ResNet18

    data = load_fashion(data_dir)

    def build() -> nn.Module:
        torch.manual_seed(seed)
        return ResNet18(in_channels=1, num_classes=10)

    return Task(
        "fashion-resnet18",
        build,
        data.train_inputs,
        data.train_targets,
        data.test_inputs,
        data.test_targets,
        batch_size=64,
        disjoint_shards=True,
    )


class TaskFactory(Protocol):
    def __call__(self, seed: int = 0, data_dir: Path | None = None) -> Task: ...


def tinylm(seed: int = 0, data_dir: Path | None = None) -> Task:
    """A ~0.9M-parameter byte-level transformer on the pydoc topics text (:mod:`psworker.tinylm`)."""
    from psworker.tinylm import tinylm as build_tinylm

    return build_tinylm(seed, data_dir)


BUILTIN_TASKS: dict[str, TaskFactory] = {
    "digits": digits,
    "fashion": fashion,
    "fashion-resnet18": fashion_resnet18,
    "tinylm": tinylm,
}


def load_task(spec: str, data_dir: Path | None = None) -> Task:
    """A built-in task by name, or ``module:function`` returning a Task.

    ``data_dir`` is where built-in tasks read data files from (see :mod:`psworker.fashion`);
    a missing or malformed file raises :class:`psworker.idx.IdxError`."""
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
        raise TaskError(f"{spec} returned {type(task).__name__}, expected psworker.tasks.Task")
    return task


@torch.no_grad()
def evaluate(model: nn.Module, task: Task, device: torch.device) -> tuple[float, float]:
    """(test accuracy, mean test loss) of ``model`` on the task's test set.

    The accuracy counts every target: one per image, or one per position of a language model's
    window (logits ``B×T×V`` against targets ``B×T``); the loss is the task's, weighted by examples."""
    model.eval()
    correct = 0
    targets = 0
    loss_sum = 0.0
    for start in range(0, task.test_inputs.shape[0], 512):
        x = task.test_inputs[start : start + 512].to(device)
        y = task.test_targets[start : start + 512].to(device)
        logits = model(x)
        loss_sum += float(task.loss(logits, y)) * y.shape[0]
        correct += int((logits.argmax(dim=-1) == y).sum())
        targets += y.numel()
    model.train()
    return correct / targets, loss_sum / task.test_inputs.shape[0]
