"""A job on a Ray cluster: its shards and groups of workers placed by resources, waited for, reported.

``RayJob.start(config)`` creates the job's directory, one :class:`~pstools.on_ray.actors.ShardActor`
per shard (on ``server_resources``) and one :class:`~pstools.on_ray.actors.WorkerActor` per worker
of each group (on the group's resources), and starts every worker's run; ``wait()`` collects the
runs, evaluates the servers' model in a Ray task and returns the report; ``stop()`` stops the shards
(each writes its final checkpoint) and kills every actor. ``run_job`` does all three.

Ray restarts a worker or a shard whose process or node died, up to its ``max_*_restarts``; a
restarted worker's run starts again (Ray retries it) and re-joins under its name. A worker that
cannot come back (restarts spent, or no node left with its resources) is *lost*: once the others
are done, a worker that does not answer within ``ANSWER_TIMEOUT_S`` is killed and reported lost,
so the job never waits on a node that is gone.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pscli.config_file import merged
from pstasks.tasks import load_task
from pstools.launcher import (
    ClusterError,
    ClusterReport,
    Evaluation,
    GroupReport,
    WorkerReport,
    evaluate_servers,
    report_of,
    worker_table,
)
from pstools.on_ray.actors import (
    JobDirectory,
    ShardActor,
    ShardAddress,
    ShardSpec,
    WorkerActor,
    WorkerOutcome,
    WorkerSpec,
)
from pstools.on_ray.config import RayJobConfig, unplaceable
from psworker.task import Task

# Ray's namespace for a job's named actors.
NAMESPACE = "hetps"
# Once some workers are done, how long the rest have to answer before they are counted lost.
ANSWER_TIMEOUT_S = 10.0
# How long the shards have to start.
SHARDS_START_TIMEOUT_S = 120.0
_POLL_S = 1.0
# How long a Ray head's address may take to accept a connection.
CONNECT_TIMEOUT_S = 5.0


class RayJobError(ClusterError):
    """A job on Ray that could not run, or ended without a report."""


@dataclass
class WorkerHandle:
    """A worker of the job: its spec, its actor and the run it was asked for."""

    spec: WorkerSpec
    actor: Any
    run: Any


def worker_specs(config: RayJobConfig, task: Task) -> list[WorkerSpec]:
    """Every worker of every group, with its ``psworker train --config`` table (its servers aside)."""
    cluster = config.cluster
    groups = config.worker_groups()
    total = sum(group.count for group in groups)
    shard_data = (task.disjoint_shards if cluster.shard_data is None else cluster.shard_data) and total > 1
    specs: list[WorkerSpec] = []
    for group in groups:
        for rank in range(group.count):
            index = len(specs)
            run: dict[str, Any] = {"name": f"{group.name}-{rank}", "slowdown": group.slowdown}
            run["seed"] = cluster.seed * 1000 + index
            if shard_data:
                run["shard_data"] = [index, total]
            table = worker_table(cluster, run)
            if "torch_threads" not in cluster.worker_config:
                table["torch_threads"] = max(1, int(group.num_cpus))
            specs.append(WorkerSpec(group, rank, table))
    return specs


def shard_specs(config: RayJobConfig) -> list[ShardSpec]:
    """Every shard: the job's rule under the cluster's ``[server]`` table, its place, its threads."""
    from psserver.flags import parse_rule_options
    from psserver.serve_cli import rule_over_file

    cluster = config.cluster
    rule: dict[str, Any] = {"name": cluster.rule, **parse_rule_options(tuple(cluster.rule_opts))}
    if cluster.lr is not None:
        rule["lr"] = cluster.lr
    server = dict(cluster.server_config)
    file_shard = dict(server.get("shard", {}))
    # As `psserver serve --rule` does.
    rule = rule_over_file(rule, file_shard.pop("rule", {}))
    server["shard"] = file_shard
    own = {"torch_threads": max(1, int(config.ray.server_cpus))}
    specs = []
    for index in range(cluster.shards):
        decided = {"shard": {"rule": rule, "shard_index": index, "num_shards": cluster.shards}}
        table = merged(merged(own, server), decided)
        specs.append(ShardSpec(index, table, config.ray.checkpoint_dir))
    return specs


class RayJob:
    """A running job on the Ray cluster this process is connected to (``ray.init``)."""

    def __init__(self, config: RayJobConfig) -> None:
        """Use ``RayJob.start``."""
        self.config = config
        # Read once: its data decide how the workers split it, its metric the report.
        self.task = load_task(config.cluster.task, config.cluster.data_dir)
        self.started = time.monotonic()
        self.directory: Any = None
        self.shards: list[Any] = []
        self.workers: list[WorkerHandle] = []

    @classmethod
    def start(cls, config: RayJobConfig) -> RayJob:
        """Start the shards, wait until they serve, then start every worker's run. A job some part
        of which no live node can hold is refused first (``RayJobError`` naming it)."""
        import ray

        problems = unplaceable(config, ray.nodes())  # type: ignore[no-untyped-call]
        if problems:
            raise RayJobError(f"no node of the Ray cluster can hold it: {'; '.join(problems)}")
        job = cls(config)
        try:
            job._start_shards()
            job._start_workers()
        except BaseException:
            job.stop()
            raise
        return job

    def _start_shards(self) -> None:
        import ray

        settings = self.config.ray
        cluster = self.config.cluster
        directory = ray.remote(JobDirectory).options(
            name=f"{settings.name}-directory", namespace=NAMESPACE, num_cpus=0, max_concurrency=16
        )
        self.directory = directory.remote(cluster.shards)
        actor = ray.remote(ShardActor)
        for spec in shard_specs(self.config):
            options = actor.options(
                name=f"{settings.name}-shard-{spec.index}",
                namespace=NAMESPACE,
                num_cpus=settings.server_cpus,
                resources=dict(settings.server_resources),
                max_restarts=settings.max_shard_restarts,
                # Its methods only read (stop aside, which a restart makes moot): asked again of a restarted shard.
                max_task_retries=-1,
                max_concurrency=4,
            )
            self.shards.append(options.remote(spec, self.directory))
        try:
            ray.get([shard.where.remote() for shard in self.shards], timeout=SHARDS_START_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            raise RayJobError(
                f"the shards did not start within {SHARDS_START_TIMEOUT_S:.0f} s: does a node offer "
                f"{settings.server_cpus:g} CPU and {dict(settings.server_resources) or 'no custom resources'}?"
            ) from None
        except ray.exceptions.RayActorError as error:
            raise RayJobError(f"a shard failed to start: {error}") from None

    def _start_workers(self) -> None:
        import ray

        settings = self.config.ray
        actor = ray.remote(WorkerActor)
        for spec in worker_specs(self.config, self.task):
            group = spec.group
            options = actor.options(
                name=f"{settings.name}-{spec.name}",
                namespace=NAMESPACE,
                num_cpus=group.num_cpus,
                num_gpus=group.num_gpus,
                resources=dict(group.resources),
                accelerator_type=group.accelerator_type,
                max_restarts=settings.max_worker_restarts,
                # A run cut short by its process's death is run again in the restarted process.
                max_task_retries=settings.max_worker_restarts,
                # pid() is answered while run() trains.
                max_concurrency=2,
            )
            handle = options.remote(spec, self.directory)
            self.workers.append(WorkerHandle(spec, handle, handle.run.remote()))  # type: ignore[attr-defined]

    def addresses(self) -> list[ShardAddress]:
        """Every shard's current address (waiting for one that is restarting)."""
        import ray

        return list(ray.get([shard.where.remote() for shard in self.shards]))

    def write_metrics_targets(self, path: Path) -> list[str]:
        """The shards' Prometheus endpoints as a file_sd file (``file_sd_configs`` reads it); the targets."""
        groups = [
            {"targets": [a.metrics_target], "labels": {"hetps_job": self.config.ray.name, "shard": str(a.index)}}
            for a in self.addresses()
            if a.metrics_target is not None
        ]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(groups, indent=2))
        return [target for group in groups for target in group["targets"]]

    def wait(self) -> ClusterReport:
        """Wait for the workers (a worker that cannot come back is counted lost), evaluate, report."""
        import ray

        cluster = self.config.cluster
        targets = self.write_metrics_targets(cluster.log_dir / "prometheus-targets.json")
        ends = _collect(self.workers, self.started + cluster.timeout_s)
        if not any(end.outcome is not None for end in ends.values()):
            problems = "; ".join(f"{name}: {end.state}, {end.why}" for name, end in ends.items())
            raise RayJobError(f"no worker finished: {problems}")
        addresses = self.addresses()
        evaluate = ray.remote(_evaluate).options(num_cpus=0)
        evaluation: Evaluation = ray.get(
            evaluate.remote(cluster.task, cluster.data_dir, [a.address for a in addresses])
        )
        workers = [_worker_report(handle.spec, ends[handle.spec.name]) for handle in self.workers]
        report = report_of(cluster, self.task, evaluation, workers, time.monotonic() - self.started)
        report.groups = [
            GroupReport.of(group.name, [w for w in workers if w.group == group.name])
            for group in self.config.worker_groups()
        ]
        report.shard_restarts = sum(a.starts - 1 for a in addresses)
        report.metrics_targets = targets
        (cluster.log_dir / "report.json").write_text(json.dumps(asdict(report), indent=2, default=str))
        return report

    def stop(self) -> None:
        """Stop the shards (final checkpoints) and kill every actor of the job."""
        import ray

        for handle in self.workers:
            ray.kill(handle.actor, no_restart=True)
        stops = [shard.stop.remote() for shard in self.shards]
        # A shard that cannot stop cleanly still goes: its last checkpoint stands.
        with contextlib.suppress(ray.exceptions.RayError, ray.exceptions.GetTimeoutError):
            ray.get(stops, timeout=60)
        for shard in self.shards:
            ray.kill(shard, no_restart=True)
        if self.directory is not None:
            ray.kill(self.directory, no_restart=True)


def run_job(config: RayJobConfig, address: str | None = None) -> ClusterReport:
    """Run ``config`` on the Ray cluster at ``address`` (None: the one this process is connected
    to, or a new local one) and return its report; a connection it made is closed after."""
    import ray

    connected_here = address is not None or not ray.is_initialized()
    if connected_here:
        connect(address)
    try:
        job = RayJob.start(config)
        try:
            return job.wait()
        finally:
            job.stop()
    finally:
        if connected_here:
            ray.shutdown()


def connect(address: str | None) -> None:
    """Connect this process to the Ray cluster at ``address`` (``auto``, ``HOST:PORT``,
    ``ray://HOST:PORT``; None: a new local one); ``RayJobError`` says why it could not."""
    import ray

    unreachable = _unreachable(address) if address is not None else None
    if unreachable is not None:
        raise RayJobError(f"--ray {address}: no Ray cluster answers there ({unreachable})")
    try:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
    except (ConnectionError, ValueError) as error:
        raise RayJobError(f"--ray {address}: cannot connect to a Ray cluster there ({error})") from None


def _unreachable(address: str) -> str | None:
    """Why a ``HOST:PORT`` address takes no connection (None when it does, or is not of that
    form): Ray itself retries an unanswered head for minutes before it says so."""
    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit():
        return None
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as error:
        return error.strerror or str(error) or type(error).__name__
    return None


def _evaluate(task: str, data_dir: Path | None, addresses: Sequence[str]) -> Evaluation:
    return evaluate_servers(load_task(task, data_dir), addresses)


@dataclass(frozen=True)
class _End:
    """How a worker's run ended (``WORKER_STATES``): its outcome when it finished, else why not."""

    state: str
    outcome: WorkerOutcome | None = None
    why: str = ""


def _collect(workers: Sequence[WorkerHandle], deadline: float) -> dict[str, _End]:
    """How each worker's run ended, by name."""
    import ray

    pending = {handle.run: handle for handle in workers}
    ends: dict[str, _End] = {}
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=_POLL_S)
        for ref in ready:
            ends[pending.pop(ref).spec.name] = _end(ref)
        if pending and any(end.outcome is not None for end in ends.values()):
            for handle in _unanswering(list(pending.values())):
                ray.kill(handle.actor, no_restart=True)
                del pending[handle.run]
                ends[handle.spec.name] = _End("lost", why="no answer after the others finished (its node gone?)")
        if time.monotonic() > deadline:
            names = ", ".join(handle.spec.name for handle in pending.values())
            raise RayJobError(f"workers {names} did not finish within the job's timeout_s")
    return ends


def _end(ref: Any) -> _End:
    import ray

    try:
        outcome: WorkerOutcome = ray.get(ref)
    except ray.exceptions.RayActorError as error:
        return _End("lost", why=f"its actor died past its restarts ({type(error).__name__})")
    except ray.exceptions.RayTaskError as error:
        return _End("failed", why=str(error.cause if error.cause is not None else error).splitlines()[0])
    return _End("restarted" if outcome.restarted else "finished", outcome)


def _unanswering(handles: Sequence[WorkerHandle]) -> list[WorkerHandle]:
    """The workers whose actors do not answer within ``ANSWER_TIMEOUT_S`` (dead, or waiting for a node)."""
    import ray

    pings = {handle.actor.pid.remote(): handle for handle in handles}
    ready, _ = ray.wait(list(pings), num_returns=len(pings), timeout=ANSWER_TIMEOUT_S)
    answered = set()
    for ref in ready:
        try:
            ray.get(ref)
            answered.add(pings[ref].spec.name)
        except ray.exceptions.RayError:
            pass
    return [handle for handle in handles if handle.spec.name not in answered]


def _worker_report(spec: WorkerSpec, end: _End) -> WorkerReport:
    outcome = end.outcome
    report = WorkerReport.of_summary(spec.name, spec.group.slowdown, outcome.summary if outcome else {})
    report.group = spec.group.name
    report.state = end.state
    report.result = outcome.result if outcome else None
    return report


__all__ = ["RayJob", "RayJobError", "connect", "run_job"]
