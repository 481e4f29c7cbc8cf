"""The ``psworker`` command: psworker's own commands plus the tools', with psworker's group kept server-free."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from pstasks.cli import main as worker_main
from pstools import cli
from pstools.cli import main
from pstools.launcher import ClusterConfig, ClusterError


def test_the_command_has_every_command() -> None:
    assert {"train", "cluster", "simulate", "export"} <= set(main.commands)
    assert main is worker_main  # one group: the tools add their commands to psworker's


def test_the_tools_commands_keep_their_flags() -> None:
    runner = CliRunner()
    cluster = runner.invoke(main, ["cluster", "--help"])
    assert cluster.exit_code == 0
    flags = ("--workers", "--slowdowns", "--rule", "--shards", "--replicas", "--consistency", "--updates", "--log-dir")
    for flag in flags:
        assert flag in cluster.output
    export = runner.invoke(main, ["export", "--help"])
    assert export.exit_code == 0 and "--checkpoint" in export.output and "--server" in export.output


def test_cluster_checks_the_slowdowns_before_starting_anything() -> None:
    result = CliRunner().invoke(main, ["cluster", "--workers", "2", "--slowdowns", "1,2,4"])
    assert result.exit_code == 2 and "3 slowdown(s) for 2 worker(s)" in result.output


def test_cluster_passes_its_file_and_flags_on_to_the_servers_and_workers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    configs: list[ClusterConfig] = []

    def stop_at_the_config(config: ClusterConfig) -> None:
        configs.append(config)
        raise ClusterError("stopped before anything started")

    monkeypatch.setattr(cli, "run_cluster", stop_at_the_config)
    toml = tmp_path / "cluster.toml"
    toml.write_text(
        "seed = 3\ntimeout_s = 60\n[server]\ndrain_seconds = 8\n[server.shard]\nreceive_buffers = 1\n"
        "[worker.train.client]\npull_dtype = 'bf16'\nerror_feedback = false\nchunk_bytes = '512KiB'\n"
    )
    flags = [
        "--workers",
        "1",
        "--slowdowns",
        "1",
        "--push-dtype",
        "int8",
        "--consistency",
        "ssp",
        "--config",
        str(toml),
    ]
    result = CliRunner().invoke(main, ["cluster", *flags])
    assert result.exit_code != 0 and len(configs) == 1, result.output
    config = configs[0]
    assert (config.seed, config.timeout_s) == (3, 60.0)
    client = {"pull_dtype": "bf16", "error_feedback": False, "chunk_bytes": "512KiB", "push_dtype": "int8"}
    assert config.worker_config == {"train": {"client": client}}
    # The servers cut pulled parameters the same way as the workers cut pushes.
    shard = {"receive_buffers": 1, "chunk_bytes": "512KiB", "consistency": {"model": "ssp"}}
    assert config.server_config == {"drain_seconds": 8, "shard": shard}


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("threads = \n", "not valid TOML"),
        ("seeds = 1\n", "unknown key seeds"),
        ("server = 1\n", "server must be a table"),
        ("[server]\nthread = 8\n", "unknown key thread"),
        ("[worker.train]\nseed = 'one'\n", "train.seed must be a whole number"),
        ("[worker.train.client]\npull_dtype = 'int8'\n", "is for pushes only"),
    ],
)
def test_a_wrong_cluster_file_exits_2_before_anything_starts(tmp_path: Path, text: str, says: str) -> None:
    toml = tmp_path / "cluster.toml"
    toml.write_text(text)
    refused = CliRunner().invoke(main, ["cluster", "--config", str(toml)])
    output = " ".join(refused.output.split())
    assert refused.exit_code == 2 and "--config" in output and says in output, output


def test_cluster_shows_at_most_17_options() -> None:
    # What a user decides: the 16 of a lone-server cluster, and --replicas.
    assert len([param for param in cli.cluster.params if param.name != "help"]) <= 17
    refused = CliRunner().invoke(main, ["cluster", "--wire-dtype", "int8"])
    assert refused.exit_code == 2 and "is for pushes only" in refused.output


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--replicas", "0"], "0 is not in the range x>=1"),
        (["--replicas", "2", "--ray", "auto"], "--replicas is for the local cluster"),
    ],
)
def test_wrong_replicas_exit_2_before_anything_starts(flags: list[str], says: str) -> None:
    refused = CliRunner().invoke(main, ["cluster", *flags])
    output = " ".join(refused.output.split())
    assert refused.exit_code == 2 and says in output, output


def test_cluster_passes_replicas_on(monkeypatch: pytest.MonkeyPatch) -> None:
    configs: list[ClusterConfig] = []

    def stop_at_the_config(config: ClusterConfig) -> None:
        configs.append(config)
        raise ClusterError("stopped before anything started")

    monkeypatch.setattr(cli, "run_cluster", stop_at_the_config)
    result = CliRunner().invoke(main, ["cluster", "--replicas", "3", "--shards", "2"])
    assert result.exit_code == 1 and "of 3 replicas" in result.output, result.output
    assert (configs[0].shards, configs[0].replicas) == (2, 3)
