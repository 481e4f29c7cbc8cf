"""psserver serve's reliability and security flags: bad values exit 2 and say what to fix."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
import torch
from click.testing import CliRunner

from psproto.layout import Layout
from psserver.cli import main
from psserver.core.checkpoint import write_checkpoint
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psserver.flags import parse_checkpoint_every


def test_checkpoint_every_takes_updates_seconds_or_both() -> None:
    assert parse_checkpoint_every("500") == (500, 0.0)
    assert parse_checkpoint_every("30s") == (0, 30.0)
    assert parse_checkpoint_every("500, 30s") == (500, 30.0)
    for bad in ("0", "-3", "ten", "5m", "", "30s,x"):
        with pytest.raises(click.BadParameter, match="positive number of updates"):
            parse_checkpoint_every(bad)


def _serve(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["serve", "--port", "0", "--metrics-port", "off", *args])
    return result.exit_code, result.output


def test_a_checkpoint_of_another_rule_exits_2(tmp_path: Path) -> None:
    layout = Layout.from_named_shapes([("w", (4,))])
    shard = Shard(ShardConfig(RuleSpec.parse("momentum", {})))
    shard.join("a", "cpu", False, layout, layout.hash)
    write_checkpoint(tmp_path, shard.state_dict(), keep=1)
    code, output = _serve("--rule", "asgd", "--checkpoint-dir", str(tmp_path))
    assert code == 2
    assert "rule momentum" in output and "--checkpoint-dir" in output


def test_unreadable_checkpoints_exit_2(tmp_path: Path) -> None:
    (tmp_path / "ckpt-00000001-clock-3.pt").write_bytes(torch.zeros(1).numpy().tobytes())
    code, output = _serve("--checkpoint-dir", str(tmp_path))
    assert code == 2 and "none can be read" in output


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (("--checkpoint-every", "0"), "--checkpoint-every"),
        (("--auth-token-file", "/nonexistent/token"), "--auth-token-file"),
    ],
)
def test_bad_flags_and_files_exit_2(args: tuple[str, ...], hint: str) -> None:
    code, output = _serve(*args)
    assert code == 2 and hint in output


@pytest.mark.parametrize(
    ("text", "hint"),
    [
        ('[checkpoints]\ndirectory = "ckpt"\nkeep = 0', "checkpoints: keep at least 1 checkpoint, not 0"),
        ("[shard]\nmax_workers = 0", "shard: max_workers must be >= 1, not 0"),
        ("[transport]\nmax_message_bytes = 0", "transport: max_message_bytes must be 1..2147483647"),
        ('[security]\nauth_token_file = "/nonexistent/token"', "/nonexistent/token"),
    ],
)
def test_bad_limits_and_files_in_the_config_file_exit_2(text: str, hint: str, tmp_path: Path) -> None:
    path = tmp_path / "server.toml"
    path.write_text(text + "\n")
    code, output = _serve("--config", str(path))
    assert code == 2 and hint in output, output
