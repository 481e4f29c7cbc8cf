"""A job on a real multi-node Ray cluster on this host: Ray's own test cluster, a head that carries
the shards and two worker nodes whose custom resources stand for two GPU kinds.

One digits job through ``psworker cluster --ray`` trains to accuracy through real actors and gRPC
while it is broken three ways: a worker's process killed (Ray restarts it and it re-joins under its
name), the shard's process killed (Ray restarts it, it restores its checkpoint on the same port and
the workers carry on), then a node removed (its workers are lost, the job finishes with the rest).
One worker runs the user's own loop (examples/ray/own_loop.py) instead of the built-in task.
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
        if self.node_b in self.cluster.worker_nodes:
            self.cluster.remove_node(self.node_b)
        self.node_b = self.cluster.add_node(num_cpus=2, resources={"gpu_b": 2}, **NODE_MEMORY)
        self.cluster.wait_for_nodes()


@pytest.fixture(scope="module")
def own_loops_on_the_path() -> Iterator[None]:
    """The cluster's processes find the user's loops of examples/ray (a group's train_fn)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", str(Path(__file__).parents[3] / "examples" / "ray"), prepend=os.pathsep)
        yield


@pytest.fixture(scope="module")
def ray_cluster(own_loops_on_the_path: None) -> Iterator[RayTestCluster]:
    head = {"num_cpus": 2, "resources": {"hetps_server": 2}, "include_dashboard": False, **NODE_MEMORY}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    cluster.add_node(num_cpus=3, resources={"gpu_a": 3}, **NODE_MEMORY)
    node_b = cluster.add_node(num_cpus=2, resources={"gpu_b": 2}, **NODE_MEMORY)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace=NAMESPACE, log_to_driver=False)
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


def _wait_for(condition: Callable[[], bool], what: str, driver: subprocess.Popen[str], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if driver.poll() is not None:
            raise AssertionError(f"the job ended before {what}: {driver.communicate()[0]}")
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


def test_a_job_reaches_accuracy_through_a_killed_worker_a_killed_shard_and_a_removed_node(
    ray_cluster: RayTestCluster, tmp_path: Path
) -> None:
    job_file = tmp_path / "job.toml"
    checkpoints = tmp_path / "checkpoints"
    job_file.write_text(
        "[server.checkpoints]\nevery_updates = 50\n"
        f'[ray]\nname = "job"\nserver_resources = {{ hetps_server = 1 }}\ncheckpoint_dir = "{checkpoints}"\n'
        '[[ray.groups]]\nname = "kind-a"\ncount = 2\nresources = { gpu_a = 1 }\n'
        '[[ray.groups]]\nname = "kind-b"\ncount = 2\nresources = { gpu_b = 1 }\nslowdown = 2.0\n'
        '[[ray.groups]]\nname = "own"\nresources = { gpu_a = 1 }\ntrain_fn = "own_loop:train"\n'
    )
    log_dir = tmp_path / "run"
    command = [sys.executable, "-m", "pstools", "cluster", "--ray", ray_cluster.cluster.address]
    command += ["--config", str(job_file), "--task", "digits", "--rule", "gap-aware", "--lr", "0.2"]
    command += ["--updates", str(UPDATES), "--log-dir", str(log_dir)]
    driver = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        _wait_for(_clock_reaches(UPDATES // 6, "job-shard-0"), "a sixth of the updates", driver)
        os.kill(ray.get(ray.get_actor("job-kind-a-0", NAMESPACE).pid.remote()), signal.SIGKILL)
        shard = ray.get_actor("job-shard-0", NAMESPACE)
        before = ray.get(shard.where.remote())
        _wait_for(_clock_reaches(UPDATES // 3, "job-shard-0"), "a third of the updates", driver)
        os.kill(before.pid, signal.SIGKILL)
        _wait_for(_clock_reaches(UPDATES // 2, "job-shard-0"), "half of the updates", driver)
        after = ray.get(shard.where.remote())
        ray_cluster.cluster.remove_node(ray_cluster.node_b)
        output, _ = driver.communicate(timeout=240)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
        ray_cluster.replace_node_b()
    assert driver.returncode == 0, output
    report = json.loads((log_dir / "report.json").read_text())
    assert report["test_accuracy"] >= ACCURACY, output
    assert report["clock"] >= UPDATES
    states = {w["name"]: w["state"] for w in report["workers"]}
    expected = {"kind-a-0": "restarted", "kind-a-1": "finished", "kind-b-0": "lost", "kind-b-1": "lost"}
    assert states == {**expected, "own-0": "finished"}, output
    groups = {g["name"]: (g["finished"], g["lost"]) for g in report["groups"]}
    assert groups == {"kind-a": (2, 0), "kind-b": (0, 2), "own": (1, 0)}
    # The shard came back once, where it was, from its checkpoints.
    assert report["shard_restarts"] == 1
    assert (after.starts, after.address) == (2, before.address) and after.pid != before.pid
    assert any(checkpoints.joinpath("shard-0").iterdir())
    (own,) = [w for w in report["workers"] if w["group"] == "own"]
    assert own["steps"] > 0 and own["pushes"] == own["steps"]
    assert own["result"]["restarted"] is False and own["result"]["last_loss"] < 2.3
    assert "final test accuracy" in output
    targets = json.loads((log_dir / "prometheus-targets.json").read_text())
    assert [t["labels"] for t in targets] == [{"hetps_job": "job", "shard": "0"}]
    assert report["metrics_targets"] == targets[0]["targets"]


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


def test_a_job_whose_every_worker_fails_says_why_for_each(ray_cluster: RayTestCluster, tmp_path: Path) -> None:
    typo = (WorkerGroup("own", 1, resources={"gpu_a": 1}, train_fn="own_loop:trian"),)
    job = RayJob.start(_config(tmp_path, groups=typo, name="typo"))
    try:
        with pytest.raises(RayJobError) as failed:
            job.wait()
    finally:
        job.stop()
    assert "no worker finished: own-0: failed" in str(failed.value)
    assert "train_fn 'own_loop:trian': own_loop has no function trian" in str(failed.value)
