"""Small CPU tasks for the simulator and the reproductions, beside the built-in ``digits`` CNN.

``digits_mlp`` is a multilayer perceptron on the 64 pixel values of the same digits data
(scikit-learn's bundled 8×8 images, no download). Use it from ``psworker train`` or
``psworker cluster`` as ``--task pstools.sim_tasks:digits_mlp``.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from pstasks.tasks import BUILTIN_TASKS, digits, load_task
from psworker.task import Task


def digits_mlp(seed: int = 0) -> Task:
    """The digits data flattened to 64 features; an MLP 64-128-64-10 (about 17k parameters)."""
    images = digits(seed)
    model_seed = seed

    def build() -> nn.Module:
        import torch

        torch.manual_seed(model_seed)
        return nn.Sequential(
            nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10)
        )

    return Task(
        name="digits-mlp",
        build_model=build,
        train_inputs=images.train_inputs,
        train_targets=images.train_targets,
        test_inputs=images.test_inputs,
        test_targets=images.test_targets,
    )


SIM_TASKS = {**BUILTIN_TASKS, "digits-mlp": digits_mlp}


def sim_task(spec: str, data_dir: Path | None = None) -> Task:
    """A task by name (``digits``, ``digits-mlp``, ``fashion``...) or ``module:function``."""
    if spec == "digits-mlp":
        return digits_mlp()
    return load_task(spec, data_dir)
