"""The actors of a job on Ray: its directory, its shards and its workers.

- :class:`JobDirectory` holds each shard's current address. A shard records itself there every
  time it starts, and asks for its previous record first, so a shard Ray restarts on the same node
  binds the same port and the workers' own retries find it; workers ask it for the addresses, and
  ask again when a shard stopped answering (it came back elsewhere).
- :class:`ShardActor` is one shard: a ``psserver`` :class:`~psserver.app.ServerApp` in the actor's
  process, restoring its newest checkpoint as it starts.
- :class:`WorkerActor` is one worker: the job's built-in task trained with
  :func:`psworker.train.train`, or the user's own function given a :class:`WorkerContext`. A worker
  Ray restarted takes over its name at once (``ClientConfig.takes_over_name``): Ray starts it only
  after the earlier process died, so no two processes push under one name.

The classes are plain; :mod:`pstools.on_ray.job` makes them Ray actors with each one's resources.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import torch
from torch import nn

from pscli.config_file import merged
from pstasks.run_config import WorkerRunConfig, with_security_files_read, worker_run_config
from pstasks.tasks import load_task
from pstools.on_ray.config import WorkerGroup
from psworker.client import ClientConfig
from psworker.optim import ParameterServerOptimizer
from psworker.procedures import StepCounts
from psworker.task import OptimizerFactory
from psworker.train import train

_LOGGER = logging.getLogger(__name__)

# How long a worker waits for every shard to be recorded in the directory.
SHARDS_UP_TIMEOUT_S = 120.0
# Failures that mean "the shard is not there": after the client's own retries, look it up again.
_GONE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


@dataclass(frozen=True)
class ShardAddress:
    """Where a shard serves now, and how many times it has started in this job."""

    index: int
    host: str
    port: int
    metrics_port: int | None
    node_id: str
    pid: int
    starts: int

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def metrics_target(self) -> str | None:
        """``HOST:PORT`` of its Prometheus endpoint (None: it serves none)."""
        return None if self.metrics_port is None else f"{self.host}:{self.metrics_port}"


class JobDirectory:
    """The job's shards' current addresses (a Ray actor with no resources of its own)."""

    def __init__(self, num_shards: int) -> None:
        self._records: list[ShardAddress | None] = [None] * num_shards

    def record(self, address: ShardAddress) -> None:
        self._records[address.index] = address

    def previous(self, index: int) -> ShardAddress | None:
        return self._records[index]

    def shards(self) -> list[ShardAddress | None]:
        return list(self._records)


@dataclass(frozen=True)
class ShardSpec:
    """One shard of a job: its ``psserver serve --config`` table and where its checkpoints go."""

    index: int
    table: Mapping[str, Any]
    checkpoint_dir: Path | None = None


class ShardActor:
    """One shard served from this actor's process; Ray restarts the process when it dies."""

    def __init__(self, spec: ShardSpec, directory: Any) -> None:
        import ray

        from psserver.allocator import apply_allocator
        from psserver.app import BindError, MetricsBindError, ServerApp
        from psserver.serve_cli import server_config

        node_id = ray.get_runtime_context().get_node_id()
        previous: ShardAddress | None = ray.get(directory.previous.remote(spec.index))
        # Back on the node it served from: the same ports, so the workers' retries reach it.
        again = previous if previous is not None and previous.node_id == node_id else None
        table: dict[str, Any] = merged(spec.table, {"host": "0.0.0.0", "port": again.port if again else 0})
        if spec.table.get("metrics") is not False:
            table = merged(table, {"metrics": {"port": (again.metrics_port if again else None) or 0}})
        if spec.checkpoint_dir is not None:
            folder = spec.checkpoint_dir / f"shard-{spec.index}"
            folder.mkdir(parents=True, exist_ok=True)
            table = merged(table, {"checkpoints": {"directory": str(folder)}})
        config = server_config(table)
        logging.basicConfig(level=config.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        apply_allocator(config.allocator)
        app = ServerApp.build(config)
        try:
            app.start()
        except (BindError, MetricsBindError):
            if again is None:
                raise
            # Its ports were taken meanwhile: any ports; the workers look it up in the directory.
            metrics = config.metrics and dataclasses.replace(config.metrics, port=0)
            app.config = dataclasses.replace(config, port=0, metrics=metrics)
            app.start()
        self.app = app
        self.address = ShardAddress(
            spec.index,
            ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]
            self.app.port,
            self.app.metrics_port,
            node_id,
            os.getpid(),
            starts=(previous.starts if previous is not None else 0) + 1,
        )
        ray.get(directory.record.remote(self.address))
        _LOGGER.info("shard %d serving at %s (start %d)", spec.index, self.address.address, self.address.starts)

    def where(self) -> ShardAddress:
        return self.address

    def clock(self) -> int:
        """Updates applied so far."""
        return self.app.shard.clock

    def stop(self) -> int:
        """Drain, write the final checkpoint and stop serving; the clock it stopped at."""
        self.app.stop()
        return self.app.shard.clock


@dataclass(frozen=True)
class WorkerContext:
    """What the user's training function (``WorkerGroup.train_fn``) is given."""

    # HOST:PORT of every shard, in shard order.
    servers: tuple[str, ...]
    # This worker's unique name ({group}-{rank}).
    name: str
    group: str
    # Its place in its group, and the group's size.
    rank: int
    group_size: int
    # Stop once the servers have applied this many updates.
    until_clock: int
    # The group's emulated slowdown (1 = full speed).
    slowdown: float
    # Ray restarted this worker: its earlier process died mid-run.
    restarted: bool
    # How the worker talks to its shards (the job's [worker] table's [train.client]).
    client: ClientConfig = field(default_factory=ClientConfig)
    counts: StepCounts = field(default_factory=StepCounts)

    def optimizer(self, model: nn.Module, build_optimizer: OptimizerFactory | None = None) -> ParameterServerOptimizer:
        """``ParameterServerOptimizer`` for this worker: its servers, name and client settings;
        its steps are counted in the job's report."""
        optimizer = ParameterServerOptimizer.configured(model, self.servers, self.name, self.client, build_optimizer)
        optimizer.counts = self.counts
        return optimizer


@dataclass(frozen=True)
class WorkerSpec:
    """One worker of a job: its group, its place, and its ``psworker train --config`` table (all
    but the servers, which it learns from the directory)."""

    group: WorkerGroup
    rank: int
    table: Mapping[str, Any]

    @property
    def name(self) -> str:
        return f"{self.group.name}-{self.rank}"


@dataclass(frozen=True)
class WorkerOutcome:
    """What a worker's run did (``psworker.train.TrainSummary`` as a dict for a built-in task)."""

    name: str
    restarted: bool
    summary: dict[str, Any]
    # What the user's function returned (None for a built-in task).
    result: Any = None


class WorkerActor:
    """One worker; Ray restarts the process when it dies and runs ``run`` again."""

    def __init__(self, spec: WorkerSpec, directory: Any) -> None:
        import ray

        self.spec = spec
        self.directory = directory
        self.restarted = ray.get_runtime_context().was_current_actor_reconstructed

    def pid(self) -> int:
        return os.getpid()

    def run(self) -> WorkerOutcome:
        """Train until the servers' clock reaches the job's end; a shard that stopped answering
        and came back elsewhere is looked up again and the run resumed there."""
        servers = self._servers()
        while True:
            try:
                return self._run(servers)
            except grpc.RpcError as error:
                # A shard that came back elsewhere recorded its new address before serving.
                moved = self._servers()
                if error.code() not in _GONE or moved == servers:
                    raise
                _LOGGER.warning("%s: shards moved to %s; resuming", self.spec.name, ", ".join(moved))
                servers = moved

    def _servers(self) -> tuple[str, ...]:
        """Every shard's address, once all have started."""
        import ray

        deadline = time.monotonic() + SHARDS_UP_TIMEOUT_S
        while None in (records := ray.get(self.directory.shards.remote())):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.spec.name}: not every shard started within {SHARDS_UP_TIMEOUT_S:.0f} s")
            time.sleep(0.5)
        return tuple(record.address for record in records)

    def _run(self, servers: tuple[str, ...]) -> WorkerOutcome:
        config = worker_run_config(merged(self.spec.table, {"train": {"servers": list(servers)}}))
        config = with_security_files_read(config)
        # Ray starts it only after the earlier process died: no two processes push under one name.
        client = config.train.client
        client = dataclasses.replace(client, takes_over_name=self.restarted or client.takes_over_name)
        config = dataclasses.replace(config, train=dataclasses.replace(config.train, client=client))
        torch.set_num_threads(config.torch_threads)
        if self.spec.group.train_fn is not None:
            return self._run_function(config, self.spec.group.train_fn)
        task = load_task(config.task, config.data_dir)
        if config.train.shard_data is not None:
            task = task.shard(*config.train.shard_data)
        summary = train(config.train, task)
        return WorkerOutcome(self.spec.name, self.restarted, dataclasses.asdict(summary))

    def _run_function(self, config: WorkerRunConfig, train_fn: str) -> WorkerOutcome:
        function = _function(train_fn)
        group = self.spec.group
        context = WorkerContext(
            servers=config.train.servers,
            name=self.spec.name,
            group=group.name,
            rank=self.spec.rank,
            group_size=group.count,
            until_clock=config.train.until_clock or 0,
            slowdown=group.slowdown,
            restarted=self.restarted,
            client=config.train.client,
        )
        result = function(context)
        counts = context.counts
        summary: dict[str, Any] = {"steps": counts.steps, "pushes": counts.pushes}
        summary |= {"mean_staleness": counts.mean_staleness, "max_staleness": counts.max_staleness}
        return WorkerOutcome(self.spec.name, self.restarted, summary, result)


def _function(spec: str) -> Callable[[WorkerContext], Any]:
    module_name, _, attribute = spec.partition(":")
    function = getattr(importlib.import_module(module_name), attribute, None)
    if not callable(function):
        raise TypeError(f"train_fn {spec!r}: {module_name} has no function {attribute}")
    return function  # type: ignore[no-any-return]
