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
    for flag in ("--workers", "--slowdowns", "--rule", "--shards", "--consistency", "--updates", "--log-dir"):
        assert flag in cluster.output
    export = runner.invoke(main, ["export", "--help"])
    assert export.exit_code == 0 and "--checkpoint" in export.output and "--server" in export.output


def test_cluster_checks_the_slowdowns_before_starting_anything() -> None:
    result = CliRunner().invoke(main, ["cluster", "--workers", "2", "--slowdowns", "1,2,4"])
    assert result.exit_code == 2 and "3 slowdown(s) for 2 worker(s)" in result.output


def test_cluster_passes_the_push_and_pull_dtypes_the_chunk_size_and_the_server_config_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    configs: list[ClusterConfig] = []

    def stop_at_the_config(config: ClusterConfig) -> None:
        configs.append(config)
        raise ClusterError("stopped before anything started")

    monkeypatch.setattr(cli, "run_cluster", stop_at_the_config)
    flags = ["--push-dtype", "int8", "--pull-dtype", "bf16", "--no-error-feedback", "--chunk-size", "512KiB"]
    result = CliRunner().invoke(main, ["cluster", "--workers", "1", "--slowdowns", "1", *flags])
    assert result.exit_code != 0 and len(configs) == 1
    chunk = ("--chunk-size", str(512 * 1024))
    assert configs[0].worker_args == (*chunk, "--no-error-feedback", "--push-dtype", "int8", "--pull-dtype", "bf16")
    # The servers cut pulled parameters the same way.
    assert configs[0].server_config == {"shard": {"chunk_bytes": 512 * 1024}}
    server_toml = tmp_path / "server.toml"
    server_toml.write_text("threads = 8\n[shard]\nreceive_buffers = 1\n")
    CliRunner().invoke(main, ["cluster", "--workers", "1", "--slowdowns", "1", "--server-config", str(server_toml)])
    assert configs[1].server_config == {"threads": 8, "shard": {"receive_buffers": 1, "chunk_bytes": 1024**2}}
    server_toml.write_text("threads = \n")
    refused = CliRunner().invoke(main, ["cluster", "--server-config", str(server_toml)])
    assert refused.exit_code == 2 and "--server-config" in refused.output and "not valid TOML" in refused.output
    refused = CliRunner().invoke(main, ["cluster", "--pull-dtype", "int8"])
    assert refused.exit_code == 2 and "is for pushes only" in refused.output
