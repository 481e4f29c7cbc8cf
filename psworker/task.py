"""What a training loop trains: the :class:`Task` interface and its :class:`Metric`.

A task is a model factory, tensors of training and test data, a loss, optionally its own inner
optimizer, and the metric its evaluation is judged by (and which way is better).
:func:`psworker.train.train` takes one; the built-in tasks, data sets and models live apart, in
:mod:`pstasks`, so the client library installs and imports without any of them. A user task is
any function returning a :class:`Task`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.nn import functional


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


# evaluate() runs the test set in chunks of at most this many examples and this many targets, so a
# language model's logits (targets × vocabulary) stay bounded: 16 windows of 1,024 bytes for
# gpt2-small (3.3 GB of fp32 logits over its 50,257 ids), 512 of tinylm's 32-byte windows.
EVAL_CHUNK_EXAMPLES = 512
EVAL_CHUNK_TARGETS = 16_384


@torch.no_grad()
def evaluate(model: nn.Module, task: Task, device: torch.device) -> tuple[float, float]:
    """(test accuracy, mean test loss) of ``model`` on the task's test set.

    The accuracy counts every target: one per image, or one per position of a language model's
    window (logits ``B×T×V`` against targets ``B×T``); the loss is the task's, weighted by examples."""
    model.eval()
    correct = 0
    targets = 0
    loss_sum = 0.0
    per_example = max(1, task.test_targets[:1].numel())
    chunk = max(1, min(EVAL_CHUNK_EXAMPLES, EVAL_CHUNK_TARGETS // per_example))
    for start in range(0, task.test_inputs.shape[0], chunk):
        x = task.test_inputs[start : start + chunk].to(device)
        y = task.test_targets[start : start + chunk].to(device)
        logits = model(x)
        loss_sum += float(task.loss(logits, y)) * y.shape[0]
        correct += int((logits.argmax(dim=-1) == y).sum())
        targets += y.numel()
    model.train()
    return correct / targets, loss_sum / task.test_inputs.shape[0]
