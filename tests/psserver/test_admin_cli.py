"""``psserver checkpoints DIR``: every checkpoint's clock, size, age and state; exit 1 when the newest is damaged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from psserver import admin_cli
from psserver.cli import main
from psserver.core.checkpoint import write_checkpoint
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from tests.psserver.test_top import primary_and_backup, status


def _state(clock: int) -> dict[str, object]:
    state = Shard(ShardConfig(RuleSpec.parse("asgd", {"lr": "0.1"}))).state_dict()
    state["clock"] = clock
    return state


def _folder(tmp_path: Path, clocks: tuple[int, ...] = (2, 4, 6)) -> list[Path]:
    return [write_checkpoint(tmp_path, _state(clock), keep=10).path for clock in clocks]


def _alter_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle - 20 : middle + 20] = bytes(b ^ 0xFF for b in data[middle - 20 : middle + 20])
    path.write_bytes(bytes(data))


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["checkpoints", *args])
    return result.exit_code, result.output


def test_intact_checkpoints_are_listed_and_exit_0(tmp_path: Path) -> None:
    paths = _folder(tmp_path)
    code, output = _run(str(tmp_path))
    assert code == 0, output
    for path, clock in zip(paths, (2, 4, 6), strict=True):
        row = next(line for line in output.splitlines() if path.name in line)
        assert f" {clock} " in row and " ok" in row and "B " in row and "s " in row
    assert "damaged" not in output


def test_a_damaged_newest_checkpoint_is_flagged_and_exits_1(tmp_path: Path) -> None:
    paths = _folder(tmp_path)
    _alter_middle(paths[-1])
    code, output = _run(str(tmp_path))
    assert code == 1, output
    row = next(line for line in output.splitlines() if paths[-1].name in line)
    assert "damaged: checksum" in row and "mismatch" in output
    assert f"a start restores {paths[1].name} (clock 4)" in output

    code, output = _run(str(tmp_path), "--json")
    assert code == 1
    document = json.loads(output)
    assert [(c["clock"], c["status"]) for c in document["checkpoints"]] == [(2, "ok"), (4, "ok"), (6, "damaged")]
    assert document["checkpoints"][2]["problem"].startswith("checksum mismatch")
    assert document["newest_damaged"] is True and document["restores"] == str(paths[1])
    newest = document["checkpoints"][2]
    assert newest["size"] == paths[2].stat().st_size and 0 <= newest["age_seconds"] < 600


def test_an_older_damaged_checkpoint_is_flagged_but_exits_0(tmp_path: Path) -> None:
    paths = _folder(tmp_path)
    paths[0].write_bytes(paths[0].read_bytes()[:200])
    code, output = _run(str(tmp_path), "--json")
    assert code == 0
    first = json.loads(output)["checkpoints"][0]
    assert first["status"] == "damaged" and first["problem"].startswith("truncated")


def test_all_damaged_says_a_start_is_refused(tmp_path: Path) -> None:
    for path in _folder(tmp_path, (1,)):
        _alter_middle(path)
    code, output = _run(str(tmp_path))
    assert code == 1 and "a start is refused" in output


def test_previous_format_checkpoints_are_unverified_not_damaged(tmp_path: Path) -> None:
    torch.save(_state(3), tmp_path / "ckpt-00000001-clock-3.pt")
    code, output = _run(str(tmp_path), "--json")
    assert code == 0
    assert json.loads(output)["checkpoints"][0]["status"] == "unverified"


def test_an_empty_folder_and_leftover_temporaries(tmp_path: Path) -> None:
    code, output = _run(str(tmp_path))
    assert code == 0 and "no checkpoints" in output
    (tmp_path / ".ckpt-00000001-clock-5.pt.tmp-42").write_bytes(b"half")
    code, output = _run(str(tmp_path))
    assert code == 0 and "1 half-written temporary file(s)" in output and ".tmp-42" in output
    code, output = _run(str(tmp_path), "--json")
    assert json.loads(output)["temporaries"] == [str(tmp_path / ".ckpt-00000001-clock-5.pt.tmp-42")]


def test_a_missing_folder_or_a_file_exits_2(tmp_path: Path) -> None:
    code, output = _run(str(tmp_path / "missing"))
    assert code == 2 and "does not exist" in output
    (tmp_path / "file").write_text("x")
    code, output = _run(str(tmp_path / "file"))
    assert code == 2 and "is a file" in output


def _status(reply: object, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(admin_cli, "_ask_shard", lambda server, security, call: reply)
    result = CliRunner().invoke(main, ["status", "--server", "10.0.0.1:50051"])
    assert result.exit_code == 0, result.output
    return result.output


def test_status_of_a_primary_shows_its_standing_and_its_backups_lag(monkeypatch: pytest.MonkeyPatch) -> None:
    output = _status(primary_and_backup()[0].status, monkeypatch)
    assert "shard 0/1  clock 40  rule sa" in output
    assert (
        "replica 10.0.0.1:50051/ab12cd34  primary  epoch 3  primary 10.0.0.1:50051  in sync yes  version 120  "
        "holds clock 40  failovers 1  digest mismatches 0"
    ) in output
    behind = next(line for line in output.splitlines() if line.split()[1:2] == ["10.0.0.3:50051"])
    assert behind.split() == ["0", "10.0.0.3:50051", "10.0.0.1:50051", "no", "7", "3.0", "MiB", "2.50", "s"]


def test_status_of_a_lone_server_shows_no_replica(monkeypatch: pytest.MonkeyPatch) -> None:
    output = _status(status(7, {"w": 3}), monkeypatch)
    assert "shard 0/1  clock 7" in output and "replica" not in output and "backup" not in output
