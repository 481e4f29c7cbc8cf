"""A digits CNN trained past 0.9 test accuracy (its users assert it) for tests that score snapshots."""

from __future__ import annotations

import torch
from torch import nn

from psworker.task import Task


def trained_digits_model(task: Task, steps: int = 300, batch: int = 64, seed: int = 0) -> nn.Module:
    """SGD with momentum on seeded minibatches: a fraction of the CPU of full-batch steps."""
    model = task.build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        index = torch.randint(0, len(task.train_targets), (batch,), generator=generator)
        optimizer.zero_grad()
        task.loss(model(task.train_inputs[index]), task.train_targets[index]).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
    return model
