"""What a job on Ray is made of: its groups of workers, where its shards go, how often Ray restarts
what dies. The ``[ray]`` table of ``psworker cluster --config`` (``[[ray.groups]]`` a group each);
the rest of a job (task, rule, shards, the ``[server]`` and ``[worker]`` tables) is the local
cluster's :class:`pstools.launcher.ClusterConfig`.

Plain data, checked when built, importing no Ray: a bad file fails before anything connects.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pscli.config_file import build
from pstools.launcher import ClusterConfig

# Group and job names go into Ray actor names and Prometheus labels.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def _check_name(what: str, name: str) -> None:
    if not _NAME.match(name):
        raise ValueError(f"{what} {name!r}: use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit")


def _check_resources(what: str, resources: Mapping[str, float]) -> None:
    for name, amount in resources.items():
        if name in ("CPU", "GPU"):
            raise ValueError(f"{what}: give {name} as num_{name.lower()}s, not as a custom resource")
        if not amount > 0:
            raise ValueError(f"{what}.{name} must be positive, not {amount}")


@dataclass(frozen=True)
class WorkerGroup:
    """Workers alike in resources and speed, e.g. the A100s of a mixed pool."""

    # The group's name: in its workers' names ({name}-{rank}), actor names and the report.
    name: str
    # How many workers the group runs.
    count: int = 1
    # CPUs each worker takes (Ray's num_cpus); its torch threads, unless the [worker] table says.
    num_cpus: float = 1.0
    # GPUs each worker takes (Ray's num_gpus); a worker given a GPU trains on it (device auto).
    num_gpus: float = 0.0
    # Custom resources each worker takes, e.g. { a100 = 1 }: the group runs on the nodes that offer them.
    resources: dict[str, float] = field(default_factory=dict)
    # Ray's accelerator_type constraint (e.g. "A100"); unset: any.
    accelerator_type: str | None = None
    # Run this many times slower than the device allows (1 = full speed), to emulate a slower one.
    slowdown: float = 1.0
    # "module:function": the user's own training loop, called with a pstools.on_ray.WorkerContext,
    # instead of the job's built-in task.
    train_fn: str | None = None

    def __post_init__(self) -> None:
        _check_name("group name", self.name)
        if self.count < 1:
            raise ValueError(f"group {self.name}: count must be at least 1, not {self.count}")
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ValueError(f"group {self.name}: num_cpus and num_gpus must be 0 or more")
        _check_resources(f"group {self.name}: resources", self.resources)
        if not self.slowdown >= 1.0:
            raise ValueError(f"group {self.name}: slowdown {self.slowdown} is below 1 (1 = full speed)")
        if self.train_fn is not None and not re.match(r"^[\w.]+:\w+$", self.train_fn):
            raise ValueError(f"group {self.name}: train_fn {self.train_fn!r} is not 'module:function'")


@dataclass(frozen=True)
class RaySettings:
    """Where a job's shards and workers run on a Ray cluster (``[ray]`` in ``psworker cluster --config``)."""

    # The job's name: its actors are {name}-shard-{i} and {name}-{group}-{rank} (Ray's namespace "hetps").
    name: str = "hetps"
    # The groups of workers ([[ray.groups]]); none: one group per distinct --slowdowns value.
    groups: tuple[WorkerGroup, ...] = ()
    # CPUs each shard actor takes.
    server_cpus: float = 1.0
    # Custom resources each shard actor takes, e.g. { hetps_server = 1 }: the nodes the shards run on.
    server_resources: dict[str, float] = field(default_factory=dict)
    # Checkpoints, on storage every node sees (shard i in checkpoint_dir/shard-i): a shard Ray
    # restarts, on any node, restores its newest. Unset: a restarted shard is re-initialised by
    # the workers from their model.
    checkpoint_dir: Path | None = None
    # How many times Ray restarts a worker whose process or node died.
    max_worker_restarts: int = 3
    # How many times Ray restarts a shard whose process or node died.
    max_shard_restarts: int = 3

    def __post_init__(self) -> None:
        _check_name("job name", self.name)
        _check_resources("server_resources", self.server_resources)
        if self.server_cpus < 0:
            raise ValueError(f"server_cpus must be 0 or more, not {self.server_cpus}")
        if self.max_worker_restarts < 0 or self.max_shard_restarts < 0:
            raise ValueError("max_worker_restarts and max_shard_restarts must be 0 or more")
        repeated = [name for name, n in Counter(g.name for g in self.groups).items() if n > 1]
        if repeated:
            raise ValueError(f"groups: the name {repeated[0]!r} is used by more than one group")


@dataclass(frozen=True)
class RayJobConfig:
    """A job on Ray: what it trains and how (the local cluster's settings) and where it runs."""

    cluster: ClusterConfig
    ray: RaySettings = field(default_factory=RaySettings)

    def worker_groups(self) -> tuple[WorkerGroup, ...]:
        """The groups to run: ``ray.groups``, else one group per distinct slowdown of ``cluster``."""
        return self.ray.groups or groups_of_slowdowns(self.cluster.slowdowns)


def worker_needs(group: WorkerGroup) -> dict[str, float]:
    """What one worker of ``group`` takes of a node, in Ray's resource names."""
    needs = {"CPU": group.num_cpus, "GPU": group.num_gpus, **group.resources}
    if group.accelerator_type is not None:
        needs[f"accelerator_type:{group.accelerator_type}"] = 0.001
    return {name: amount for name, amount in needs.items() if amount > 0}


def unplaceable(config: RayJobConfig, nodes: Sequence[Mapping[str, Any]]) -> list[str]:
    """What no live node of the cluster (``ray.nodes()``) can hold: a shard, or one worker of a
    group; each as a sentence saying what it asks for. A group whose kind of node is not up yet
    (an autoscaler adding it on demand) is one of them: keep a node of each kind up."""
    offered = [node["Resources"] for node in nodes if node.get("Alive")]

    def fits(needs: Mapping[str, float]) -> bool:
        return any(all(resources.get(name, 0.0) >= amount for name, amount in needs.items()) for resources in offered)

    def described(needs: Mapping[str, float]) -> str:
        return ", ".join(name if name.startswith("accelerator_type:") else f"{name} {n:g}" for name, n in needs.items())

    settings = config.ray
    problems = []
    shard = {name: n for name, n in {"CPU": settings.server_cpus, **settings.server_resources}.items() if n > 0}
    if not fits(shard):
        problems.append(f"a shard asks for {described(shard)} (server_cpus, server_resources)")
    for group in config.worker_groups():
        if not fits(worker_needs(group)):
            problems.append(f"a worker of group {group.name} asks for {described(worker_needs(group))}")
    return problems


def groups_of_slowdowns(slowdowns: Sequence[float]) -> tuple[WorkerGroup, ...]:
    """One group per distinct slowdown (``x1``, ``x2`` ...), each as many workers as ask for it."""
    counts = Counter(float(s) for s in slowdowns)
    return tuple(WorkerGroup(f"x{s:g}", n, slowdown=s) for s, n in sorted(counts.items()))


def ray_settings(table: Mapping[str, Any]) -> RaySettings:
    """The ``[ray]`` table of a ``psworker cluster --config`` file; a ``ConfigFileError`` names a bad key."""
    return build(RaySettings, table, where="ray.")
