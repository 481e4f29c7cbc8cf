from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
from click.testing import CliRunner

from psserver import app, serve_cli
from psserver.app import ServerConfig
from psserver.cli import LAZY_COMMANDS, main
from psserver.core.rules import RULES
from psserver.flags import parse_receive_window
from psserver.rpc.server import ServerLimits


def test_rules_lists_every_rule_with_its_options() -> None:
    result = CliRunner().invoke(main, ["rules"], terminal_width=200)
    assert result.exit_code == 0
    for name in RULES:
        assert name in result.output
    assert "momentum" in result.output and "0.9" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rule", "sgd-nope"], "unknown rule 'sgd-nope'; available rules: "),
        (["--rule", "momentum", "--rule-opt", "momentum=1.5"], "out of range"),
        (["--rule", "momentum", "--rule-opt", "velocity=1"], "unknown option velocity; valid options: lr, momentum"),
        (["--rule", "momentum", "--rule-opt", "momentum=fast"], "not a valid float"),
        (["--rule-opt", "lr"], "is not key=value"),
        (["--lr", "-1"], "--lr"),
        (["--shard-index", "2", "--num-shards", "2"], "must be below --num-shards"),
        (
            ["--shard-index", "0", "--num-shards", "2", "--shard-index-from-hostname"],
            "give --shard-index or --shard-index-from-hostname, not both",
        ),
        (["--receive-idle-seconds", "0"], "--receive-idle-seconds"),
        (["--min-transfer-rate", "0"], "--min-transfer-rate"),
        (["--min-transfer-rate", "fast"], "'fast' is not a valid float"),
        (["--transfer-grace-seconds", "-1"], "--transfer-grace-seconds"),
        (["--receive-window", "32KiB"], "is 32768 bytes; a window is 64KiB (65536) to 2147483647 bytes"),
        (["--receive-window", "2GiB"], "is 2147483648 bytes; a window is 64KiB"),
        (["--receive-window", "2048MiB"], "is 2147483648 bytes; a window is 64KiB"),
        (["--receive-window", "4MB"], "give 'auto' or a whole number of bytes, KiB, MiB or GiB"),
        (["--receive-window", "1.5MiB"], "give 'auto' or a whole number of bytes, KiB, MiB or GiB"),
        (["--receive-window", "large"], "--receive-window"),
        (["--chunk-size", "32KiB"], "a chunk of 32768 bytes is below the smallest, 65536 (64KiB)"),
        (["--chunk-size", "1.5MiB"], "give a whole number of bytes, KiB or MiB (e.g. 1MiB)"),
        (["--chunk-size", "1MiB", "--max-message-mb", "1"], "above half the largest message (1048576 bytes)"),
        (["--ready-file", "/nonexistent/folder/ready.json"], "its folder /nonexistent/folder does not exist"),
        (["--pull-versions", "0"], "Invalid value for '--pull-versions': 0 is not in the range x>=1"),
        (["--pull-versions", "two"], "Invalid value for '--pull-versions'"),
        (["--max-receiving-pushes", "-1"], "Invalid value for '--max-receiving-pushes': -1 is not in the range x>=0"),
        (["--malloc-mmap-mib", "33"], "Invalid value for '--malloc-mmap-mib': 33 is not in the range 0<=x<=32"),
        (["--malloc-mmap-mib", "-1"], "Invalid value for '--malloc-mmap-mib'"),
        (["--malloc-arenas", "0"], "Invalid value for '--malloc-arenas': 0 is not in the range 1<=x<=64"),
        (["--malloc-arenas", "two"], "Invalid value for '--malloc-arenas'"),
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
    ("text", "size"),
    [
        ("auto", None),
        ("AUTO", None),
        ("65536", 65536),
        ("64KiB", 65536),
        ("1MiB", 1024**2),
        (" 4 mib ", 4 * 1024**2),
        ("1GiB", 1024**3),
    ],
)
def test_receive_window_sizes(text: str, size: int | None) -> None:
    assert parse_receive_window(text) == size


def test_status_of_an_unreachable_server_is_a_clear_error() -> None:
    result = CliRunner().invoke(main, ["status", "--server", "127.0.0.1:1", "--timeout", "1"])
    assert result.exit_code == 1
    assert "127.0.0.1:1" in result.output and "UNAVAILABLE" in result.output


@pytest.mark.parametrize(
    ("flag", "window"),
    [([], 4 * 1024**2), (["--receive-window", "auto"], None), (["--receive-window", "1MiB"], 1024**2)],
)
def test_serve_gives_the_server_the_receive_window_asked_for(
    flag: list[str], window: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _limits_given(flag, monkeypatch).receive_window_bytes == window


def _limits_given(flags: list[str], monkeypatch: pytest.MonkeyPatch) -> ServerLimits:
    """The transport limits ``psserver serve FLAGS`` starts its server with (stopped before binding)."""
    given: list[ServerLimits] = []

    def start_server(*args: object, limits: ServerLimits, **kwargs: object) -> None:
        given.append(limits)
        raise OSError("stopped by the test before binding")

    monkeypatch.setattr(app, "start_server", start_server)
    result = CliRunner().invoke(main, ["serve", "--port", "0", "--no-metrics", *flags], terminal_width=200)
    assert result.exit_code == 1 and "stopped by the test" in result.output
    assert len(given) == 1
    return given[0]


@pytest.mark.parametrize(
    ("flags", "chunk"),
    [
        ([], 1024**2),
        (["--chunk-size", "2MiB"], 2 * 1024**2),
        (["--chunk-size", "65536"], 64 * 1024),
        (["--max-message-mb", "1"], 512 * 1024),  # the default, halved to fit the message limit
    ],
)
def test_serve_cuts_pulled_parameters_into_the_chunks_asked_for(
    flags: list[str], chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert _limits_given(flags, monkeypatch).reply_chunk_bytes == chunk


@pytest.mark.parametrize(
    ("flags", "versions", "mmap_mib", "receiving"),
    [
        ([], 2, 32, 0),
        (["--pull-versions", "1", "--malloc-mmap-mib", "0", "--max-receiving-pushes", "4"], 1, 0, 4),
    ],
)
def test_serve_maps_the_memory_flags_into_the_server(
    flags: list[str], versions: int, mmap_mib: int, receiving: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    configs: list[ServerConfig] = []
    thresholds: list[int] = []
    monkeypatch.setattr(serve_cli, "map_large_buffers", thresholds.append)
    monkeypatch.setattr(serve_cli, "run", configs.append)
    result = CliRunner().invoke(main, ["serve", "--port", "0", "--no-metrics", *flags], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert [config.shard_config().pull_versions for config in configs] == [versions]
    assert [config.shard_config().max_receiving_pushes for config in configs] == [receiving]
    assert thresholds == [mmap_mib]


@pytest.mark.parametrize(("environment", "warned"), [({}, True), ({"MALLOC_ARENA_MAX": "1"}, False)])
def test_serve_says_when_its_arena_cap_is_not_in_effect(
    environment: dict[str, str],
    warned: bool,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Started without the psserver entry point, nothing re-executed the process with the cap set.
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(serve_cli, "map_large_buffers", lambda mib: True)
    monkeypatch.setattr(serve_cli, "run", lambda config: None)
    with caplog.at_level("WARNING", logger=serve_cli.__name__):
        result = CliRunner().invoke(main, ["serve", "--port", "0", "--no-metrics"], terminal_width=200)
    assert result.exit_code == 0, result.output
    said = [r.getMessage() for r in caplog.records if "--malloc-arenas" in r.getMessage()]
    assert said == (
        [
            "--malloc-arenas 1 is not in effect: this process started with MALLOC_ARENA_MAX=unset "
            "(the psserver entry point sets it when the process starts)"
        ]
        if warned
        else []
    )


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
    assert "--receive-window" in result.output


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["status", "--help"],
        ["top", "--help"],
        ["checkpoint", "--help"],
        ["status", "--server", "127.0.0.1:9", "--timeout", "0.5"],  # runs, and fails: nothing listens there
        ["checkpoint", "--server", "127.0.0.1:9", "--timeout", "0.5"],
    ],
)
def test_the_admin_commands_start_without_torch_or_the_server(args: list[str]) -> None:
    code = (
        "import sys; from psserver.cli import main\n"
        f"try:\n    main({args!r})\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'psserver.serve_cli', 'psserver.core.shard') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_an_unknown_command_is_a_usage_error_naming_it() -> None:
    result = CliRunner().invoke(main, ["nope"])
    assert result.exit_code == 2
    assert "No such command 'nope'" in result.output
