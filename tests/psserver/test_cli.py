from __future__ import annotations

import pytest
from click.testing import CliRunner

from psserver.cli import main, parse_receive_window
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
        (["--rule", "sgd-nope"], "unknown rule 'sgd-nope'; available rules: "),
        (["--rule", "momentum", "--rule-opt", "momentum=1.5"], "out of range"),
        (["--rule", "momentum", "--rule-opt", "velocity=1"], "unknown option velocity; valid options: lr, momentum"),
        (["--rule", "momentum", "--rule-opt", "momentum=fast"], "not a valid float"),
        (["--rule-opt", "lr"], "is not key=value"),
        (["--lr", "-1"], "--lr"),
        (["--shard-index", "2", "--num-shards", "2"], "must be below --num-shards"),
        (["--receive-window", "32KiB"], "give 'auto' or a size from 64KiB"),
        (["--receive-window", "2GiB"], "give 'auto' or a size from 64KiB"),
        (["--receive-window", "2147483648"], "give 'auto' or a size from 64KiB"),
        (["--receive-window", "large"], "--receive-window"),
    ],
)
def test_serve_refuses_bad_configuration_with_exit_2(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["serve", "--port", "0", *args], terminal_width=200)
    assert result.exit_code == 2, result.output
    assert message in result.output


@pytest.mark.parametrize(
    ("text", "size"),
    [("auto", None), ("AUTO", None), ("65536", 65536), ("64KiB", 65536), ("1MiB", 1024**2), (" 4 mib ", 4 * 1024**2)],
)
def test_receive_window_sizes(text: str, size: int | None) -> None:
    assert parse_receive_window(text) == size


def test_status_of_an_unreachable_server_is_a_clear_error() -> None:
    result = CliRunner().invoke(main, ["status", "--server", "127.0.0.1:1", "--timeout", "1"])
    assert result.exit_code == 1
    assert "127.0.0.1:1" in result.output and "UNAVAILABLE" in result.output
