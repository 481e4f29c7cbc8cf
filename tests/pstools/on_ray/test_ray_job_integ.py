"""Jobs on a real multi-node Ray cluster on this host: Ray's own test cluster, a head that carries the
shards and two worker nodes whose custom resources stand for two GPU kinds.

Two jobs train digits to accuracy through real actors and gRPC and break something on the way. The
first, through ``psworker cluster --ray``: a worker's process killed (Ray restarts it and it
re-joins under its name). The second, through the Python API, one group running the user's own
loop: a shard's process killed (Ray restarts it, it restores its checkpoint on the same port and the
workers carry on), then a node removed (its workers are lost, the job finishes with the rest).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import ray
from click.testing import CliRunner
from ray.cluster_utils import Cluster

from pstools.cli import main
from pstools.launcher import ClusterConfig
from pstools.on_ray import RayJob, RayJobConfig, RayJobError, RaySettings, WorkerGroup
from pstools.on_ray.job import NAMESPACE

NODE_MEMORY = {"object_store_memory": 80 * 2**20}
# Two workers of each kind: A (full speed) and B (half speed), on their own nodes.
GROUPS = (
    WorkerGroup("kind-a", 2, num_cpus=1, resources={"gpu_a": 1}),
    WorkerGroup("kind-b", 2, num_cpus=1, resources={"gpu_b": 1}, slowdown=2.0),
)
UPDATES = 600
ACCURACY = 0.8


@dataclass
class RayTestCluster:
    cluster: Cluster
    node_b: Any

    def replace_node_b(self) -> None:
        self.cluster.remove_node(self.node_b)
        self.node_b = self.cluster.add_node(num_cpus=2, resources={"gpu_b": 2}, **NODE_MEMORY)
        self.cluster.wait_for_nodes()


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[RayTestCluster]:
    head = {"num_cpus": 2, "resources": {"hetps_server": 2}, "include_dashboard": False, **NODE_MEMORY}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    cluster.add_node(num_cpus=2, resources={"gpu_a": 2}, **NODE_MEMORY)
    node_b = cluster.add_node(num_cpus=2, resources={"gpu_b": 2}, **NODE_MEMORY)
    cluster.wait_for_nodes()
    # The workers find the user's training loop of examples/ray (a group's train_fn) on their path.
    loops = {"env_vars": {"PYTHONPATH": str(Path(__file__).parents[3] / "examples" / "ray")}}
    ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False, runtime_env=loops)
    try:
        yield RayTestCluster(cluster, node_b)
    finally:
        ray.shutdown()
        cluster.shutdown()


def _config(
    log_dir: Path,
    server_config: dict[str, Any] | None = None,
    groups: tuple[WorkerGroup, ...] = GROUPS,
    **ray_settings: Any,
) -> RayJobConfig:
    cluster = ClusterConfig(
        task="digits", rule="gap-aware", lr=0.2, until_clock=UPDATES, log_dir=log_dir, timeout_s=240
    )
    cluster.server_config = server_config or {}
    settings = RaySettings(groups=groups, server_resources={"hetps_server": 1}, **ray_settings)
    return RayJobConfig(cluster, settings)


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def _clock_reaches(clock: int, shard_name: str = "hetps-shard-0") -> Callable[[], bool]:
    def reached() -> bool:
        try:
            return bool(ray.get(ray.get_actor(shard_name, NAMESPACE).clock.remote(), timeout=5) >= clock)
        except (ValueError, ray.exceptions.RayError):
            return False  # not created yet, or restarting

    return reached


def test_the_command_line_job_reaches_accuracy_across_nodes_and_a_killed_worker_rejoins(
    ray_cluster: RayTestCluster, tmp_path: Path
) -> None:
    job_file = tmp_path / "job.toml"
    job_file.write_text(
        '[ray]\nname = "cli"\nserver_resources = { hetps_server = 1 }\n'
        '[[ray.groups]]\nname = "kind-a"\ncount = 2\nresources = { gpu_a = 1 }\n'
        '[[ray.groups]]\nname = "kind-b"\ncount = 2\nresources = { gpu_b = 1 }\nslowdown = 2.0\n'
    )
    log_dir = tmp_path / "run"
    command = [sys.executable, "-m", "pstools", "cluster", "--ray", ray_cluster.cluster.address]
    command += ["--config", str(job_file), "--task", "digits", "--rule", "gap-aware", "--lr", "0.2"]
    command += ["--updates", str(UPDATES), "--log-dir", str(log_dir)]
    driver = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(_clock_reaches(UPDATES // 4, "cli-shard-0"), "a quarter of the updates")
        victim = ray.get_actor("cli-kind-a-0", NAMESPACE)
        os.kill(ray.get(victim.pid.remote()), signal.SIGKILL)
        output, _ = driver.communicate(timeout=240)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
    assert driver.returncode == 0, output
    report = json.loads((log_dir / "report.json").read_text())
    assert report["test_accuracy"] >= ACCURACY, output
    assert report["clock"] >= UPDATES
    states = {w["name"]: w["state"] for w in report["workers"]}
    assert states == {"kind-a-0": "restarted", "kind-a-1": "finished", "kind-b-0": "finished", "kind-b-1": "finished"}
    groups = {g["name"]: g for g in report["groups"]}
    assert groups["kind-a"]["finished"] == groups["kind-b"]["finished"] == 2
    # The half-speed kind pushes less often, so its gradients are staler.
    assert groups["kind-b"]["mean_staleness"] > groups["kind-a"]["mean_staleness"] > 0
    assert "final test accuracy" in output
    targets = json.loads((log_dir / "prometheus-targets.json").read_text())
    assert [t["labels"] for t in targets] == [{"hetps_job": "cli", "shard": "0"}]
    assert report["metrics_targets"] == targets[0]["targets"]


def test_a_killed_shard_restores_its_checkpoint_and_a_removed_node_takes_only_its_workers(
    ray_cluster: RayTestCluster, tmp_path: Path
) -> None:
    # Kind A runs the user's own loop (examples/ray/own_loop.py), kind B the built-in task.
    own_loop = WorkerGroup("kind-a", 2, num_cpus=1, resources={"gpu_a": 1}, train_fn="own_loop:train")
    every_50 = {"checkpoints": {"every_updates": 50}}
    checkpoints = tmp_path / "checkpoints"
    config = _config(tmp_path / "run", every_50, (own_loop, GROUPS[1]), name="faults", checkpoint_dir=checkpoints)
    job = RayJob.start(config)
    try:
        before = job.addresses()[0]
        _wait_for(_clock_reaches(UPDATES // 6, "faults-shard-0"), "a sixth of the updates")
        os.kill(before.pid, signal.SIGKILL)
        _wait_for(_clock_reaches(UPDATES // 2, "faults-shard-0"), "half of the updates")
        ray_cluster.cluster.remove_node(ray_cluster.node_b)
        report = job.wait()
        after = job.addresses()[0]
    finally:
        job.stop()
        ray_cluster.node_b = ray_cluster.cluster.add_node(num_cpus=2, resources={"gpu_b": 2}, **NODE_MEMORY)
        ray_cluster.cluster.wait_for_nodes()
    assert report.shard_restarts == 1
    assert (after.starts, after.address) == (2, before.address) and after.pid != before.pid
    assert any(checkpoints.joinpath("shard-0").iterdir())
    states = {w.name: w.state for w in report.workers}
    assert states == {"kind-a-0": "finished", "kind-a-1": "finished", "kind-b-0": "lost", "kind-b-1": "lost"}
    assert [(g.name, g.finished, g.lost) for g in report.groups] == [("kind-a", 2, 0), ("kind-b", 0, 2)]
    own = [w for w in report.workers if w.group == "kind-a"]
    assert all(w.steps > 0 and w.pushes == w.steps for w in own), own
    assert all(w.result["restarted"] is False and w.result["last_loss"] < 2.3 for w in own), own
    assert report.clock >= UPDATES
    # Workers come back from their retries' backoff seconds apart, and the late ones' gradients
    # are stale (up to ~100 updates here): a lower bar than a clean run's.
    assert report.test_accuracy >= ACCURACY - 0.1


def test_a_job_no_node_can_hold_is_refused_before_any_actor_starts(ray_cluster: RayTestCluster, tmp_path: Path) -> None:
    h100 = (WorkerGroup("h100", 1, num_gpus=1, resources={"h100": 1}),)
    with pytest.raises(RayJobError) as refused:
        RayJob.start(_config(tmp_path, groups=h100, name="nowhere"))
    assert "group h100 asks for CPU 1, GPU 1, h100 1" in str(refused.value)
    with pytest.raises(ValueError, match="Failed to look up actor"):
        ray.get_actor("nowhere-shard-0", NAMESPACE)


def test_an_address_where_no_ray_cluster_answers_exits_1_at_once() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    started = time.monotonic()
    refused = CliRunner().invoke(main, ["cluster", "--ray", f"127.0.0.1:{port}"])
    assert refused.exit_code == 1 and "no Ray cluster answers there (Connection refused)" in refused.output
    assert time.monotonic() - started < 10
