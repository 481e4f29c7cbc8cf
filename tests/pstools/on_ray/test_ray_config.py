"""A job on Ray as data: the [ray] table checked key by key, the shards' and workers' tables it
makes, the groups' report, and the command line's refusals, all before anything connects."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from pscli.config_file import ConfigFileError
from psserver.serve_cli import server_config
from pstasks.run_config import worker_run_config
from pstasks.tasks import load_task
from pstools.cli import main
from pstools.launcher import ClusterConfig, GroupReport, WorkerReport
from pstools.on_ray.config import (
    RayJobConfig,
    RaySettings,
    WorkerGroup,
    groups_of_slowdowns,
    ray_settings,
    unplaceable,
)
from pstools.on_ray.job import shard_specs, worker_specs


def test_a_ray_table_reads_groups_with_their_resources() -> None:
    settings = ray_settings(
        {
            "name": "mixed",
            "server_resources": {"hetps_server": 1},
            "checkpoint_dir": "/shared/ckpt",
            "groups": [
                {"name": "a100", "count": 2, "num_gpus": 1, "resources": {"a100": 1}, "accelerator_type": "A100"},
                {"name": "t4", "count": 4, "num_gpus": 1, "resources": {"t4": 1}, "slowdown": 2},
            ],
        }
    )
    assert settings.checkpoint_dir == Path("/shared/ckpt")
    assert settings.server_resources == {"hetps_server": 1.0}
    a100, t4 = settings.groups
    assert (a100.count, a100.num_gpus, a100.resources, a100.accelerator_type) == (2, 1.0, {"a100": 1.0}, "A100")
    assert (t4.count, t4.slowdown, t4.accelerator_type) == (4, 2.0, None)


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ({"groups": [{"name": "a", "cnt": 2}]}, "unknown key ray.groups[0].cnt"),
        ({"groups": [{"count": 2}]}, "needs the key ray.groups[0].name"),
        ({"groups": {"name": "a"}}, "ray.groups must be a list"),
        ({"groups": [{"name": "a", "resources": {"a100": 0}}]}, "resources.a100 must be positive"),
        ({"groups": [{"name": "a", "resources": {"GPU": 1}}]}, "give GPU as num_gpus"),
        ({"groups": [{"name": "a", "resources": ["a100"]}]}, "ray.groups[0].resources must be a table"),
        ({"groups": [{"name": "a", "count": 0}]}, "count must be at least 1"),
        ({"groups": [{"name": "a", "slowdown": 0.5}]}, "slowdown 0.5 is below 1"),
        ({"groups": [{"name": "a", "train_fn": "train.py"}]}, "is not 'module:function'"),
        ({"groups": [{"name": "a b"}]}, "group name 'a b'"),
        ({"groups": [{"name": "a"}, {"name": "a"}]}, "'a' is used by more than one group"),
        ({"server_resources": {"x": "one"}}, "ray.server_resources.x must be a number"),
        ({"max_worker_restarts": -1}, "must be 0 or more"),
        ({"address": "auto"}, "unknown key ray.address"),
    ],
)
def test_a_wrong_ray_table_names_its_key(table: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigFileError) as refused:
        ray_settings(table)
    assert says in str(refused.value)


def test_without_groups_each_speed_is_a_group() -> None:
    groups = groups_of_slowdowns((1.0, 1.0, 2.0, 4.0))
    assert [(g.name, g.count, g.slowdown) for g in groups] == [("x1", 2, 1.0), ("x2", 1, 2.0), ("x4", 1, 4.0)]
    job = RayJobConfig(ClusterConfig(workers=2, slowdowns=(1.0, 3.0)))
    assert [g.name for g in job.worker_groups()] == ["x1", "x3"]


def test_every_worker_gets_a_unique_name_seed_and_its_groups_threads_and_speed(tmp_path: Path) -> None:
    groups = (WorkerGroup("fast", 2, num_cpus=2), WorkerGroup("slow", 1, slowdown=3.0))
    cluster = ClusterConfig(task="digits", until_clock=700, seed=5, log_dir=tmp_path, eval_every=0)
    specs = worker_specs(RayJobConfig(cluster, RaySettings(groups=groups)), load_task("digits"))
    runs = [worker_run_config({**spec.table, "train": {**spec.table["train"], "servers": ["h:1"]}}) for spec in specs]
    assert [spec.name for spec in specs] == [r.train.name for r in runs] == ["fast-0", "fast-1", "slow-0"]
    assert [r.train.seed for r in runs] == [5000, 5001, 5002]
    assert [r.train.slowdown for r in runs] == [1.0, 1.0, 3.0]
    assert [r.torch_threads for r in runs] == [2, 2, 1]
    assert {r.train.until_clock for r in runs} == {700}
    # digits trains every worker on all of it; asked for, worker i takes part i of three.
    assert {r.train.shard_data for r in runs} == {None}
    cluster.shard_data = True
    specs = worker_specs(RayJobConfig(cluster, RaySettings(groups=groups)), load_task("digits"))
    assert [spec.table["train"]["shard_data"] for spec in specs] == [[0, 3], [1, 3], [2, 3]]


def test_each_shard_gets_the_jobs_rule_and_its_place(tmp_path: Path) -> None:
    server = {"drain_seconds": 16, "shard": {"rule": {"name": "gap-aware", "lr": 0.5}, "lease_seconds": 9.0}}
    cluster = ClusterConfig(rule="asgd", lr=0.02, rule_opts=(), shards=2, server_config=server)
    specs = shard_specs(RayJobConfig(cluster, RaySettings(checkpoint_dir=tmp_path, server_cpus=2)))
    configs = [server_config(spec.table) for spec in specs]
    assert [(c.shard.shard_index, c.shard.num_shards) for c in configs] == [(0, 2), (1, 2)]
    # Another rule than the file's takes none of the file's options; the file's other keys stay.
    assert {(c.shard.rule.rule.name, c.shard.rule.options.lr) for c in configs} == {("asgd", 0.02)}
    assert {(c.drain_seconds, c.torch_threads, c.shard.lease_seconds) for c in configs} == {(16, 2, 9.0)}
    assert {spec.checkpoint_dir for spec in specs} == {tmp_path}
    same_rule = ClusterConfig(rule="gap-aware", lr=None, server_config=server)
    (spec,) = shard_specs(RayJobConfig(same_rule))
    assert server_config(spec.table).shard.rule.options.lr == 0.5


def _worker(group: str, state: str, pushes: int, staleness: float) -> WorkerReport:
    report = WorkerReport(f"{group}-x", 1.0, pushes, pushes, staleness, int(staleness * 2), 0.01)
    report.group, report.state = group, state
    return report


def test_a_groups_report_weighs_staleness_by_pushes_and_counts_the_lost() -> None:
    workers = [_worker("a", "finished", 100, 1.0), _worker("a", "restarted", 300, 3.0), _worker("a", "lost", 0, 0.0)]
    group = GroupReport.of("a", workers)
    assert (group.count, group.finished, group.lost, group.pushes) == (3, 2, 1, 400)
    assert group.mean_staleness == pytest.approx(2.5)
    assert group.max_staleness == 6


def test_a_ray_table_without_ray_exits_2(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('[[ray.groups]]\nname = "a"\n')
    refused = CliRunner().invoke(main, ["cluster", "--config", str(job)])
    assert refused.exit_code == 2 and "give --ray ADDRESS" in refused.output, refused.output


def test_a_wrong_ray_table_exits_2_before_connecting(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('[[ray.groups]]\nname = "a"\ngpus = 1\n')
    refused = CliRunner().invoke(main, ["cluster", "--ray", "127.0.0.1:1", "--config", str(job)])
    output = " ".join(refused.output.split())
    assert refused.exit_code == 2 and "unknown key ray.groups[0].gpus" in output, output


def test_without_the_ray_extra_the_command_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("pstools.cli.find_spec", lambda name: None)
    refused = CliRunner().invoke(main, ["cluster", "--ray", "auto"])
    assert refused.exit_code == 2 and "pip install 'hetps[ray]'" in refused.output, refused.output


def _node(alive: bool = True, **resources: float) -> dict[str, object]:
    return {"Alive": alive, "Resources": resources}


def test_a_job_no_live_node_can_hold_is_named_part_by_part() -> None:
    groups = (
        WorkerGroup("a100", 2, num_gpus=1, resources={"a100": 1}, accelerator_type="A100"),
        WorkerGroup("cpu", 1, num_cpus=4),
    )
    job = RayJobConfig(ClusterConfig(), RaySettings(groups=groups, server_resources={"hetps_server": 1}))
    head = _node(CPU=2, hetps_server=2)
    gpu = _node(CPU=8, GPU=1, a100=1, **{"accelerator_type:A100": 1})
    assert unplaceable(job, [head, gpu]) == []
    problems = unplaceable(job, [head, _node(alive=False, CPU=8, GPU=1, a100=1), _node(CPU=3, GPU=1, a100=1)])
    assert problems == [
        "a worker of group a100 asks for CPU 1, GPU 1, a100 1, accelerator_type:A100",
        "a worker of group cpu asks for CPU 4",
    ]
    assert unplaceable(job, [gpu]) == ["a shard asks for CPU 1, hetps_server 1 (server_cpus, server_resources)"]


def test_ray_checkpoint_dir_gives_the_shards_their_checkpoint_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[ClusterConfig] = []
    monkeypatch.setattr("pstools.cli._run_on_ray", lambda config, *_: runs.append(config))
    job = tmp_path / "job.toml"
    job.write_text("[server.checkpoints]\nevery_updates = 50\n")
    refused = CliRunner().invoke(main, ["cluster", "--ray", "auto", "--config", str(job)])
    assert refused.exit_code == 2 and "checkpoints.directory" in refused.output, refused.output
    job.write_text(f'[server.checkpoints]\nevery_updates = 50\n[ray]\ncheckpoint_dir = "{tmp_path}"\n')
    accepted = CliRunner().invoke(main, ["cluster", "--ray", "auto", "--config", str(job)])
    assert accepted.exit_code == 0, accepted.output
    assert runs[0].server_config["checkpoints"] == {"every_updates": 50, "directory": str(tmp_path)}
