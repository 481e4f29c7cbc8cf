from __future__ import annotations

import importlib
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from psserver import serve_cli
from psserver.app import ServerConfig
from psserver.cli import LAZY_COMMANDS, main
from psserver.core.rules import RULES


def test_rules_lists_every_rule_with_its_options() -> None:
    result = CliRunner().invoke(main, ["rules"], terminal_width=200)
    assert result.exit_code == 0
    for name in RULES:
        assert name in result.output
    assert "momentum" in result.output and "0.9" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rule", "sgd-nope"], "shard.rule.name 'sgd-nope' is not a rule; choose one of adaptive-braking, agn"),
        (["--rule", "momentum", "--rule-opt", "momentum=1.5"], "out of range"),
        (["--rule", "momentum", "--rule-opt", "velocity=1"], "unknown option velocity; valid options: lr, momentum"),
        (["--rule", "momentum", "--rule-opt", "momentum=fast"], "not a valid float"),
        (["--rule-opt", "lr"], "is not key=value"),
        (["--lr", "-1"], "--lr"),
        (["--shard-index", "2", "--num-shards", "2"], "shard_index 2 must be 0..1 (2 shards)"),
        (
            ["--shard-index", "0", "--num-shards", "2", "--shard-index-from-hostname"],
            "give --shard-index or --shard-index-from-hostname, not both",
        ),
        (["--tls-client-ca", __file__], "security.tls needs the key security.tls.cert"),
        (["--ready-file", "/nonexistent/folder/ready.json"], "its folder /nonexistent/folder does not exist"),
        (["--rule", "sa", "--rule-opt", "dylu=true"], "option dylu (DyLU) needs a windowed rule"),
        (["--rule", "diloco", "--rule-opt", "dylu_min=0"], "option dylu_min=0 is out of range"),
        (
            ["--rule", "diloco-dn", "--rule-opt", "dylu=true", "--consistency", "bsp"],
            "DyLU (dylu=true) is for asynchronous training",
        ),
        (
            ["--rule", "diloco-dn", "--rule-opt", "pull_grace=1", "--consistency", "bsp"],
            "pull_grace is for asynchronous training",
        ),
        (["--rule", "diloco-dn", "--rule-opt", "pull_grace=-1"], "option pull_grace=-1 is out of range"),
        (["--rule", "diloco", "--rule-opt", "pull_grace=1"], "unknown option pull_grace"),
    ],
)
def test_serve_refuses_bad_configuration_with_exit_2(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["serve", "--port", "0", *args], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert message in result.output


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bogus = 1", "unknown key bogus; valid keys here: allocator, checkpoints, drain_seconds, host"),
        ("[shard]\nbogus = 1", "unknown key shard.bogus; valid keys here: "),
        ('port = "x"', "port must be a whole number, not 'x'"),
        ("port = 1.5", "port must be a whole number, not 1.5"),
        ("[shard]\nreceive_buffers = 0", "shard: receive_buffers must be >= 1, not 0"),
        ("[shard]\npull_versions = 0", "shard: pull_versions must be >= 1, not 0"),
        ("[shard]\nmax_receiving_pushes = -1", "shard: max_receiving_pushes must be >= 0 (0: no cap), not -1"),
        ("[shard]\nreceive_idle_seconds = 0", "shard: receive_idle_seconds must be > 0, not 0.0"),
        ("[shard.transfer_pace]\nmin_bytes_per_s = 0", "a transfer pace needs a positive rate"),
        ('[shard]\nchunk_bytes = "32KiB"', "a chunk of 32768 bytes is below the smallest, 65536 (64KiB)"),
        ('[shard]\nchunk_bytes = "1.5MiB"', "shard.chunk_bytes must be a whole number of bytes, KiB, MiB or GiB"),
        (
            '[shard]\nchunk_bytes = "1MiB"\n[transport]\nmax_message_bytes = "1MiB"',
            "above half the largest message (1048576 bytes)",
        ),
        ('[shard.consistency]\nmodel = "sometimes"', "shard.consistency.model must be one of async, ssp, bsp"),
        ('[transport]\nreceive_window_bytes = "32KiB"', "receive_window_bytes 32768 is outside 65536..2147483647"),
        ('[transport]\nreceive_window_bytes = "2GiB"', "receive_window_bytes 2147483648 is outside 65536"),
        ('[transport]\nreceive_window_bytes = "large"', 'a whole number of bytes, KiB, MiB or GiB (4MiB) or "auto"'),
        ("[transport]\nmax_concurrent_rpcs = 0", "max_concurrent_rpcs must be >= 1, not 0"),
        ("[allocator]\narenas = 0", "allocator: arenas must be 1..64, not 0"),
        ('[allocator]\nmmap_threshold_bytes = "2GiB"', "mmap_threshold_bytes must be 0..2147483647 (2GiB - 1)"),
        ("[allocator]\nenabled = 1", "allocator.enabled must be true or false, not 1"),
        ('[checkpoints]\nkeep = 0\ndirectory = "ckpt"', "checkpoints: keep at least 1 checkpoint, not 0"),
        ("[checkpoints]\nkeep = 2", "checkpoints needs the key checkpoints.directory"),
        ("metrics = 3", "metrics must be a table (or false), not 3"),
        ("[metrics]\nworker_series = -1", "metrics: worker_series must be 0 or more, not -1"),
        ('log_level = "LOUD"', "log_level must be one of DEBUG, INFO, WARNING, ERROR, not 'LOUD'"),
        ('[shard.rule]\nname = "momentum"\nvelocity = 1', "shard.rule: unknown option velocity"),
        ("port = ", "is not valid TOML"),
    ],
)
def test_a_config_file_key_that_cannot_be_used_exits_2_naming_it(text: str, message: str, tmp_path: Path) -> None:
    path = tmp_path / "server.toml"
    path.write_text(text + "\n")
    result = CliRunner().invoke(main, ["serve", "--config", str(path)], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert f"--config {path}: " in result.output and message in result.output, result.output


def _config_of(args: list[str], monkeypatch: pytest.MonkeyPatch) -> ServerConfig:
    """The ``ServerConfig`` ``psserver serve ARGS`` would run (stopped before building the server)."""
    configs: list[ServerConfig] = []
    monkeypatch.setattr(serve_cli, "apply_allocator", lambda config: {})
    monkeypatch.setattr(serve_cli, "run", configs.append)
    result = CliRunner().invoke(main, ["serve", *args], terminal_width=200)
    assert result.exit_code == 0, result.output
    (config,) = configs
    return config


def test_every_setting_comes_from_the_file_and_a_flag_given_overrides_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "server.toml"
    path.write_text(
        'port = 7000\ndrain_seconds = 3\ntorch_threads = "auto"\nmetrics = false\n'
        "[shard]\nnum_shards = 2\nshard_index = 1\npull_versions = 1\nmax_receiving_pushes = 4\n"
        '[shard.rule]\nname = "momentum"\nlr = 0.5\nmomentum = 0.8\n'
        '[shard.consistency]\nmodel = "ssp"\nstaleness_bound = 5\n'
        '[transport]\nreceive_window_bytes = "auto"\nmax_message_bytes = "1MiB"\n'
        "[allocator]\narenas = 2\n"
    )
    config = _config_of(["--config", str(path)], monkeypatch)
    shard = config.shard
    assert (config.port, config.drain_seconds, config.torch_threads, config.metrics) == (7000, 3, None, None)
    assert (shard.num_shards, shard.shard_index, shard.pull_versions, shard.max_receiving_pushes) == (2, 1, 1, 4)
    assert shard.rule.rule.name == "momentum" and shard.rule.options.as_strings() == {"lr": "0.5", "momentum": "0.8"}
    assert (shard.consistency.model.value, shard.consistency.staleness_bound) == ("ssp", 5)
    assert config.transport.receive_window_bytes is None and config.transport.max_message_bytes == 1024**2
    assert shard.chunk_bytes == 512 * 1024  # the default chunk, halved to fit the message limit
    assert config.allocator.arenas == 2
    flags = ["--port", "7001", "--lr", "0.25", "--shard-index", "0", "--ssp-bound", "2", "--metrics-port", "0"]
    config = _config_of(["--config", str(path), *flags], monkeypatch)
    shard = config.shard
    assert (config.port, shard.shard_index, shard.num_shards, config.drain_seconds) == (7001, 0, 2, 3)
    assert shard.rule.options.as_strings() == {"lr": "0.25", "momentum": "0.8"}  # the file's other options kept
    assert (shard.consistency.model.value, shard.consistency.staleness_bound) == ("ssp", 2)
    assert config.metrics is not None and config.metrics.port == 0
    # Another rule than the file's takes none of its options.
    other = _config_of(["--config", str(path), "--rule", "asgd"], monkeypatch).shard.rule
    assert other.rule.name == "asgd" and "momentum" not in other.options.as_strings()


def test_the_shard_index_from_the_hostname_counts_the_shards_of_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "server.toml"
    path.write_text("[shard]\nnum_shards = 3\n")
    monkeypatch.setenv("HOSTNAME", "psserver-2")
    config = _config_of(["--config", str(path), "--shard-index-from-hostname"], monkeypatch)
    assert (config.shard.shard_index, config.shard.num_shards) == (2, 3)
    path.write_text("[shard]\nnum_shards = 2\n")
    result = CliRunner().invoke(main, ["serve", "--config", str(path), "--shard-index-from-hostname"])
    assert result.exit_code == 2 and "--shard-index-from-hostname" in result.output, result.output


def test_without_a_file_every_setting_has_its_default(monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config_of([], monkeypatch)
    assert config.shard.rule.rule.name == "asgd" and config.shard.chunk_bytes == 1024**2
    assert config.transport.receive_window_bytes == 1024**2 and config.allocator.arenas == 1
    assert config.torch_threads == 2 and config.checkpoints is None and config.metrics is not None


def test_serve_help_shows_at_most_20_options_in_sections() -> None:
    command = serve_cli.serve
    options = [param for param in command.params if isinstance(param, click.Option)]
    assert len(options) <= 20
    result = CliRunner().invoke(main, ["serve", "--help"], terminal_width=200)
    assert result.exit_code == 0
    for heading in ("Model & rule:", "Cluster:", "Checkpoints:", "Security:", "Observability:", "Configuration:"):
        assert heading in result.output
    # Every option is listed once, under its section.
    assert all(result.output.count(f"  {option.opts[0]} ") == 1 for option in options)


def test_the_group_help_shows_each_lazy_command_as_its_own_help_would() -> None:
    for name, (module, attribute, help_text) in LAZY_COMMANDS.items():
        command = getattr(importlib.import_module(module), attribute)
        assert help_text == command.help, f"LAZY_COMMANDS[{name!r}] no longer matches {module}.{attribute}'s help"
    result = CliRunner().invoke(main, ["--help"], terminal_width=200)
    assert result.exit_code == 0
    assert "serve        Serve one shard of a model's parameters over gRPC until SIGTERM." in result.output


def test_a_lazy_command_runs_and_shows_its_own_help() -> None:
    result = CliRunner().invoke(main, ["serve", "--help"], terminal_width=200)
    assert result.exit_code == 0
    assert "--checkpoint-dir" in result.output


def test_an_unknown_command_is_a_usage_error_naming_it() -> None:
    result = CliRunner().invoke(main, ["nope"])
    assert result.exit_code == 2
    assert "No such command 'nope'" in result.output
