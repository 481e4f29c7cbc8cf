"""The configuration file of ``psworker train --config``: every setting of a worker's run.

Its top level names the task and the process's resources; ``[task_options]`` what the run
changes of the task (:class:`pstasks.tasks.TaskOptions`); ``[train]`` is the run
(:class:`psworker.train.TrainConfig`), ``[train.client]`` how the worker talks to its shards
(:class:`psworker.client.ClientConfig`), ``[train.client.tls]`` the TLS files. Read with the
server's own reader (:mod:`pscli.config_file`): an unknown key, a wrong type or a bad value is a
``ConfigFileError`` naming the key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pscli.config_file import build
from psproto.security import client_security
from pstasks.tasks import TaskOptions
from psworker.train import TrainConfig

# When no stopping rule is set: train until the server has applied this many updates.
DEFAULT_UNTIL_CLOCK = 1000


@dataclass(frozen=True)
class WorkerRunConfig:
    """``psworker train``'s settings: the task, its data, the process's threads, the run."""

    # The run: servers, stopping rule, pacing, logging, and how to talk to the shards.
    train: TrainConfig
    # Built-in task (digits, fashion, fashion-resnet18, tinylm, gpt2-small) or module:function.
    task: str = "digits"
    # What the run changes of the task: its batch size, a language model's window length.
    task_options: TaskOptions = field(default_factory=TaskOptions)
    # Directory of the task's data files (default: $HETPS_DATA_DIR, else /usr/share/datasets/fashion-mnist).
    data_dir: Path | None = None
    # Threads torch computes with in this process.
    torch_threads: int = 1
    # File holding the servers' bearer token.
    auth_token_file: Path | None = None

    def __post_init__(self) -> None:
        if self.torch_threads < 1:
            raise ValueError(f"torch_threads must be at least 1, not {self.torch_threads}")


def with_security_files_read(config: WorkerRunConfig) -> WorkerRunConfig:
    """``config`` with its TLS files checked and its token file read into the client's settings;
    ``psproto.security.SecurityConfigError`` says what to fix."""
    client = config.train.client
    tls = client.tls
    tls_config, token = client_security(
        tls.ca if tls else None, tls.cert if tls else None, tls.key if tls else None, config.auth_token_file
    )
    client = dataclasses.replace(client, tls=tls_config, auth_token=token or client.auth_token)
    return dataclasses.replace(config, train=dataclasses.replace(config.train, client=client))


def worker_run_config(table: Mapping[str, Any]) -> WorkerRunConfig:
    """The run of a configuration table (a file's, flags put over it); without a stopping rule it
    trains until the clock reaches ``DEFAULT_UNTIL_CLOCK``."""
    config = build(WorkerRunConfig, table)
    run = config.train
    if run.max_steps is None and run.until_clock is None and run.max_seconds is None:
        config = dataclasses.replace(config, train=dataclasses.replace(run, until_clock=DEFAULT_UNTIL_CLOCK))
    return config
