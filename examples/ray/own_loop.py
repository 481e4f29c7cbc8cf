"""A training loop of one's own on Ray: a group with ``train_fn = "own_loop:train"`` runs it.

A plain PyTorch loop over the digits task's data, changed in the two usual lines: the optimizer is
the worker's ``ParameterServerOptimizer`` (``context.optimizer``), and the loop ends when the
servers' clock reaches the job's ``until_clock``. Its return value comes back in the job's report.
"""

from __future__ import annotations

from typing import Any

import torch

from pstasks.tasks import load_task
from pstools.on_ray import WorkerContext


def train(context: WorkerContext) -> dict[str, Any]:
    task = load_task("digits")  # the job's --task: the servers hold this model
    model = task.build_model()
    generator = torch.Generator().manual_seed(context.rank)
    opt = context.optimizer(model)  # was: torch.optim.SGD(model.parameters(), lr=...)
    loss = torch.tensor(float("nan"))
    while opt.client.clock < context.until_clock:
        batch = torch.randint(0, task.train_size, (task.batch_size,), generator=generator)
        opt.zero_grad()
        loss = task.loss(model(task.train_inputs[batch]), task.train_targets[batch])
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step(float(loss))
    opt.close()
    return {"last_loss": float(loss), "restarted": context.restarted}
