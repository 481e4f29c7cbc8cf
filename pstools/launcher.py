"""A local cluster: psserver processes (one per shard, or a replica set of them) and N psworker processes of
chosen speeds.

With ``replicas`` R >= 2 every shard is a replica set of R servers (one primary, the rest backups)
that a local etcd (:mod:`pstools.etcd`, in the log folder) elects among, and each worker is given
every shard's set as ``HOST:PORT|HOST:PORT``. Everything talks over real gRPC on 127.0.0.1.
When the workers are done the launcher reads each shard's Status, pulls the final parameters as
an observer, evaluates them on the task's test set, stops the servers with SIGTERM (then etcd)
and reports (by the task's metric: test accuracy, or validation loss and perplexity).
"""

from __future__ import annotations

import json
import logging
import math
import re
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from pscli.config_file import dump_toml, merged
from psproto.layout import LayoutError
from psproto.v1 import ps_pb2
from psserver.ready import ReadyFileError, wait_for_ready_file
from pstasks.task_error import TaskError
from pstasks.tasks import load_task
from pstools.etcd import EtcdError, LocalEtcd, free_ports
from pstools.server_set import Relaunch, Server, ServerSet
from pstools.warm_start import WarmProcess, start_program
from psworker.binding import ModelBinding
from psworker.client import PSClient
from psworker.task import Task, evaluate, metric_named, perplexity

_LOGGER = logging.getLogger(__name__)

SERVER_START_TIMEOUT_S = 60.0


class ClusterError(RuntimeError):
    """A process of the local cluster failed."""


@dataclass
class ClusterConfig:
    workers: int = 4
    slowdowns: Sequence[float] = (1.0, 1.0, 2.0, 4.0)
    rule: str = "asgd"
    lr: float | None = None
    rule_opts: Sequence[str] = ()
    task: str = "digits"
    until_clock: int = 1500
    shards: int = 1
    # Servers per shard: 1 is a lone server; from 2 on a replica set elected in a local etcd.
    replicas: int = 1
    wire_dtype: str = "fp32"
    log_dir: Path = Path("runs/latest")
    device: str = "auto"
    seed: int = 0
    eval_every: int = 0
    timeout_s: float = 600.0
    server_args: Sequence[str] = ()
    # A ``psserver serve --config`` table for every shard (psserver.app.ServerConfig).
    server_config: Mapping[str, Any] = field(default_factory=dict)
    # Where built-in tasks read their data (None: the workers' $HETPS_DATA_DIR or the system's directory).
    data_dir: Path | None = None
    # Whether worker r trains on part r of `workers` disjoint parts of the training set; None: as
    # the task says (the Fashion-MNIST tasks shard, digits does not).
    shard_data: bool | None = None
    # A ``psworker train --config`` table for every worker (pstasks.run_config.WorkerRunConfig).
    worker_config: Mapping[str, Any] = field(default_factory=dict)


@dataclass
class WorkerReport:
    name: str
    slowdown: float
    steps: int
    pushes: int
    mean_staleness: float
    max_staleness: int
    compute_seconds_per_step: float
    # On Ray (pstools.on_ray): the worker's group, and how it ended (WORKER_STATES).
    group: str = ""
    state: str = "finished"
    # What the user's training function returned (pstools.on_ray WorkerGroup.train_fn), as JSON allows.
    result: Any = None

    @classmethod
    def of_summary(cls, name: str, slowdown: float, summary: Mapping[str, Any]) -> WorkerReport:
        """From a worker's summary (``psworker.train.TrainSummary`` as a dict; empty: nothing known)."""
        return cls(
            name=name,
            slowdown=slowdown,
            steps=int(summary.get("steps", 0)),
            pushes=int(summary.get("pushes", 0)),
            mean_staleness=float(summary.get("mean_staleness", 0.0)),
            max_staleness=int(summary.get("max_staleness", 0)),
            compute_seconds_per_step=float(summary.get("compute_seconds_per_step", 0.0)),
        )


# How a worker's run ended: as asked; as asked after its engine restarted it; its process and
# every restart gone before the job ended (lost); or with an error from its own code (failed).
WORKER_STATES = ("finished", "restarted", "lost", "failed")


@dataclass
class GroupReport:
    """A group of workers (same resources and speed) in a job's report."""

    name: str
    count: int
    finished: int
    lost: int
    steps: int
    pushes: int
    mean_staleness: float
    max_staleness: int

    @classmethod
    def of(cls, name: str, workers: Sequence[WorkerReport]) -> GroupReport:
        pushes = sum(w.pushes for w in workers)
        staleness = sum(w.mean_staleness * w.pushes for w in workers)
        return cls(
            name,
            len(workers),
            finished=sum(w.state in ("finished", "restarted") for w in workers),
            lost=sum(w.state in ("lost", "failed") for w in workers),
            steps=sum(w.steps for w in workers),
            pushes=pushes,
            mean_staleness=staleness / pushes if pushes else 0.0,
            max_staleness=max((w.max_staleness for w in workers), default=0),
        )


@dataclass
class ClusterReport:
    rule: str
    test_accuracy: float
    test_loss: float
    clock: int
    wall_seconds: float
    workers: list[WorkerReport] = field(default_factory=list)
    rejected: dict[str, int] = field(default_factory=dict)
    # The task's metric (psworker.task.Metric) and its value; perplexity beside a loss metric.
    metric: str = "accuracy"
    higher_is_better: bool = True
    metric_value: float = math.nan
    perplexity: float | None = None
    # On Ray (pstools.on_ray): each group of workers, the scrape targets.
    groups: list[GroupReport] = field(default_factory=list)
    # How often a shard's server was started again (by Ray, or a local cluster's replicas).
    shard_restarts: int = 0
    metrics_targets: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """The final evaluation in words, e.g. ``test accuracy 0.9700 (loss 0.0824)``."""
        return metric_named(self.metric).describe(self.test_accuracy, self.test_loss)


def start_server(
    log_dir: Path,
    rule: str,
    lr: float | None,
    rule_opts: Sequence[str],
    extra_args: Sequence[str] = (),
    log_name: str | None = None,
    environment: Mapping[str, str] | None = None,
    config: Mapping[str, Any] | None = None,
) -> tuple[WarmProcess, str]:
    """Start ``psserver serve`` on a free loopback port; returns the process and its address.

    Its log goes to ``log_dir/server-<shard>.log`` (or ``log_dir/<log_name>``, e.g. for a restart).
    ``environment`` adds to (or overrides) this process's environment for the server; ``config``
    is a ``psserver serve --config`` table, written beside the log (one torch thread unless it says;
    its ``shard.shard_index`` and ``shard.num_shards`` say which shard of how many)."""
    shard_index = (config or {}).get("shard", {}).get("shard_index", 0)
    command = [
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--rule",
        rule,
        # Any free port: local shards and tests must not fight over the default; extra_args may override.
        "--metrics-port",
        "0",
    ]
    if lr is not None:
        command += ["--lr", repr(lr)]
    for opt in rule_opts:
        command += ["--rule-opt", opt]
    command += list(extra_args)
    log_path = log_dir / (log_name or f"server-{shard_index}.log")
    # One torch thread: local shards and workers share this machine's cores.
    config_file = log_path.with_suffix(".toml")
    config_file.write_text(dump_toml(merged({"torch_threads": 1}, config or {})))
    command += ["--config", str(config_file)]
    # The server writes its address here once it accepts RPCs (psserver.ready).
    ready_file = log_path.with_suffix(".ready.json")
    ready_file.unlink(missing_ok=True)
    command += ["--ready-file", str(ready_file)]
    process = start_program("psserver", command, log_path, environment)
    try:
        ready = wait_for_ready_file(ready_file, process, SERVER_START_TIMEOUT_S)
    except ReadyFileError as error:
        if process.poll() is None:
            process.kill()
        process.wait()
        raise ClusterError(f"psserver shard {shard_index} did not start ({error}); see {log_path}") from None
    return process, ready.address


def run_cluster(config: ClusterConfig) -> ClusterReport:
    """Start the servers and workers, wait for the workers, evaluate, stop everything."""
    if len(config.slowdowns) != config.workers:
        raise ValueError(f"{len(config.slowdowns)} slowdowns for {config.workers} workers; give one per worker")
    # Before any process starts: a model that cannot be split this way fails here, not in every
    # worker. Missing or malformed data files raise pstasks.idx.IdxError, unwrapped.
    try:
        task = load_task(config.task, config.data_dir)
        ModelBinding(task.build_model(), num_shards=config.shards)
    except (LayoutError, TaskError) as error:
        raise ClusterError(f"--task {config.task} with --shards {config.shards}: {error}") from None
    shard_data = (task.disjoint_shards if config.shard_data is None else config.shard_data) and config.workers > 1
    config.log_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    servers = ServerSet()
    workers: list[WarmProcess] = []
    # A fresh etcd for every run: a previous run's keys in this folder (and its primaries' leases,
    # which etcd renews when it restarts) would only delay the first election.
    shutil.rmtree(config.log_dir / "etcd", ignore_errors=True)
    try:
        etcd = LocalEtcd(config.log_dir / "etcd") if config.replicas > 1 else None
    except EtcdError as error:
        raise ClusterError(f"--replicas {config.replicas} needs etcd: {error}") from None
    try:
        addresses = start_shards(config, servers, etcd.url if etcd else None)
        servers.watch()
        for rank in range(config.workers):
            command = ["train", "--config", str(_worker_config_file(config, rank, addresses, shard_data))]
            workers.append(start_program("pstools", command, config.log_dir / f"worker-{rank}.log"))
        _wait_for_workers(config, workers, started)
        report = _report(config, task, addresses, started)
        report.shard_restarts = servers.restarts
    finally:
        for process in workers:
            if process.poll() is None:
                process.kill()
                process.wait()
        codes = servers.stop()
        if etcd is not None:
            etcd.stop()
    if any(code != 0 for code in codes):
        raise ClusterError(f"a server exited with {codes} after SIGTERM; see {config.log_dir}")
    (config.log_dir / "report.json").write_text(json.dumps(_as_json(report), indent=2))
    return report


def start_shards(config: ClusterConfig, servers: ServerSet, etcd_url: str | None) -> list[str]:
    """Start every shard's servers (added to ``servers`` as they start, so a failure stops those
    already up); returns each shard's address for the workers: ``HOST:PORT``, or with replicas the
    replica set ``HOST:PORT|HOST:PORT`` (the workers find its primary). A replica is told etcd and
    the cluster's job (``--etcd URL/JOB``) and a port of its own (``free_ports``), advertises the
    loopback address it bound, and can be started again there (``ServerSet.watch``)."""
    addresses = []
    for index in range(config.shards):
        shard = merged(config.server_config, {"shard": {"shard_index": index, "num_shards": config.shards}})
        replicas = []
        # A replica comes back at its port: one no port-0 bind can be given while it is down.
        ports = free_ports(config.replicas) if etcd_url is not None else []
        for replica in range(config.replicas):
            args, table, log_name = list(config.server_args), shard, f"server-{index}.log"
            relaunch = None
            if etcd_url is not None:
                args += ["--port", str(ports[replica]), "--etcd", f"{etcd_url}/{cluster_job(config.log_dir)}"]
                table = _own_checkpoints(shard, replica)
                log_name = f"server-{index}-{replica}.log"
                relaunch = _relaunch(config, args, table)
            process, address = start_server(
                config.log_dir, config.rule, config.lr, config.rule_opts, args, log_name, config=table
            )
            servers.add(Server(process, address, log_name, relaunch))
            replicas.append(address)
        addresses.append("|".join(replicas))
    return addresses


def _relaunch(config: ClusterConfig, args: list[str], table: Mapping[str, Any]) -> Relaunch:
    """How a replica started with ``args`` and ``table`` starts again (``ServerSet``)."""

    def start_again(more_args: Sequence[str], log_name: str) -> WarmProcess | None:
        try:
            process, _ = start_server(
                config.log_dir, config.rule, config.lr, config.rule_opts, [*args, *more_args], log_name, config=table
            )
        except ClusterError as error:
            _LOGGER.error("%s", error)
            return None
        return process

    return start_again


def cluster_job(log_dir: Path) -> str:
    """The etcd job of a local cluster: its log folder's name, in letters, digits, ``.``, ``_``, ``-``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", log_dir.resolve().name).strip("-.") or "hetps"


def _own_checkpoints(table: dict[str, Any], replica: int) -> dict[str, Any]:
    """A replica's server table: its checkpoints, if any, in a folder of its own (``replica-R``), so
    two replicas of a shard never write or prune each other's files."""
    checkpoints = table.get("checkpoints")
    if not isinstance(checkpoints, Mapping) or "directory" not in checkpoints:
        return table
    return merged(table, {"checkpoints": {"directory": str(Path(checkpoints["directory"]) / f"replica-{replica}")}})


def _worker_config_file(config: ClusterConfig, rank: int, servers: list[str], shard_data: bool) -> Path:
    """Worker ``rank``'s ``psworker train --config`` file (:func:`worker_table`, its log in the log folder)."""
    run: dict[str, Any] = {
        "servers": servers,
        "name": f"worker-{rank}",
        "slowdown": float(config.slowdowns[rank]),
        "seed": config.seed * 1000 + rank,
        "log_file": str(config.log_dir / f"worker-{rank}.jsonl"),
    }
    if shard_data:
        run["shard_data"] = [rank, config.workers]
    path = config.log_dir / f"worker-{rank}.toml"
    path.write_text(dump_toml(worker_table(config, run)))
    return path


def worker_table(config: ClusterConfig, run: Mapping[str, Any]) -> dict[str, Any]:
    """A worker's ``psworker train --config`` table: the cluster's worker table under what the
    cluster decides (the task, its data, the stopping clock, no progress bar, and ``run``: servers,
    name, speed, seed, data part ...), one torch thread unless the worker table says."""
    train = {"eval_every": config.eval_every, "device": config.device, "client": {"wire_dtype": config.wire_dtype}}
    own: dict[str, Any] = {"torch_threads": 1, "train": train}
    decided: dict[str, Any] = {"task": config.task}
    if config.data_dir is not None:
        decided["data_dir"] = str(config.data_dir)
    decided["train"] = {"until_clock": config.until_clock, "progress": False, **run}
    return merged(merged(own, config.worker_config), decided)


def _wait_for_workers(config: ClusterConfig, workers: list[WarmProcess], started: float) -> None:
    """Wait for every worker to finish; a ClusterError names one that failed or ran out of time."""
    deadline = started + config.timeout_s
    for rank, process in enumerate(workers):
        remaining = max(1.0, deadline - time.monotonic())
        try:
            code = process.wait(remaining)
        except subprocess.TimeoutExpired:
            raise ClusterError(f"worker-{rank} did not finish within {config.timeout_s:.0f} s") from None
        if code != 0:
            raise ClusterError(f"worker-{rank} exited with {code}; see {config.log_dir / f'worker-{rank}.log'}")


@dataclass(frozen=True)
class Evaluation:
    """The servers' model evaluated on the task's test set, with their clock and refusals."""

    accuracy: float
    loss: float
    clock: int
    rejected: dict[str, int]


def evaluate_servers(task: Task, addresses: Sequence[str]) -> Evaluation:
    """Pull the servers' parameters as an observer and evaluate them on ``task``'s test set."""
    model = task.build_model()
    binding = ModelBinding(model, num_shards=len(addresses))
    with PSClient(list(addresses), binding.layout, name="launcher-eval", observer=True) as observer:
        statuses: list[ps_pb2.StatusResponse] = observer.status()
        observer.pull(binding.params)
        binding.scatter_params()
    accuracy, loss = evaluate(model, task, torch.device("cpu"))
    rejected: dict[str, int] = {}
    for status in statuses:
        for reason, count in status.rejected.items():
            rejected[reason] = rejected.get(reason, 0) + count
    return Evaluation(accuracy, loss, min(s.clock for s in statuses), rejected)


def _report(config: ClusterConfig, task: Task, addresses: list[str], started: float) -> ClusterReport:
    evaluation = evaluate_servers(task, addresses)
    summaries = {}
    for rank in range(config.workers):
        path = config.log_dir / f"worker-{rank}.jsonl"
        done = [json.loads(line) for line in path.read_text().splitlines() if '"event": "done"' in line]
        summaries[rank] = done[-1] if done else {}
    # Workers leave the server when done, so their own summaries (built from the staleness the
    # server returned for every push) are the record.
    workers = [
        WorkerReport.of_summary(f"worker-{rank}", slowdown, summaries[rank])
        for rank, slowdown in enumerate(config.slowdowns)
    ]
    return report_of(config, task, evaluation, workers, time.monotonic() - started)


def report_of(
    config: ClusterConfig, task: Task, evaluation: Evaluation, workers: list[WorkerReport], wall_seconds: float
) -> ClusterReport:
    """The run's report: its evaluation by the task's metric, and its workers."""
    return ClusterReport(
        config.rule,
        evaluation.accuracy,
        evaluation.loss,
        evaluation.clock,
        wall_seconds,
        workers,
        evaluation.rejected,
        metric=task.metric.name,
        higher_is_better=task.metric.higher_is_better,
        metric_value=task.metric.of(evaluation.accuracy, evaluation.loss),
        perplexity=None if task.metric.higher_is_better else perplexity(evaluation.loss),
    )


def _as_json(report: ClusterReport) -> dict[str, object]:
    return asdict(report)
