"""A digits CNN trained well past 0.9 test accuracy in about a second, for tests that score snapshots."""

from __future__ import annotations

import torch
from torch import nn

from psworker.tasks import Task


def trained_digits_model(task: Task, steps: int = 300, batch: int = 64, seed: int = 0) -> nn.Module:
    """SGD with momentum on seeded minibatches (0.97–0.98 test accuracy for seeds 0–3); full-batch
    steps would reach the same in about ten times the CPU."""
    model = task.build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        index = torch.randint(0, len(task.train_targets), (batch,), generator=generator)
        optimizer.zero_grad()
        task.loss(model(task.train_inputs[index]), task.train_targets[index]).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    return model
