"""The configuration file format (pscli.config_file): tables merged key by key, written back as read."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

from pscli.config_file import ConfigFileError, dump_toml, merged, read_toml


def test_tables_merge_key_by_key_and_the_later_wins() -> None:
    base = {"port": 1, "shard": {"num_shards": 2, "rule": {"name": "asgd", "lr": 0.1}}}
    over = {"shard": {"rule": {"lr": 0.5}}, "threads": 4}
    assert merged(base, over) == {
        "port": 1,
        "threads": 4,
        "shard": {"num_shards": 2, "rule": {"name": "asgd", "lr": 0.5}},
    }
    assert base["shard"]["rule"]["lr"] == 0.1  # type: ignore[index]  # neither table is changed


def test_a_table_is_written_as_the_toml_it_is_read_from(tmp_path: Path) -> None:
    table = {
        "torch_threads": 1,
        "ready_file": str(tmp_path / 'a "quoted" name'),
        "shard": {"lease_seconds": 3600.0, "rule": {"name": "momentum", "nesterov": True}},
        "transport": {"receive_window_bytes": "auto"},
    }
    path = tmp_path / "server.toml"
    path.write_text(dump_toml(table))
    assert read_toml(path) == table == tomllib.loads(dump_toml(table))


def test_a_missing_or_malformed_file_names_itself(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError, match=r"missing\.toml: No such file or directory"):
        read_toml(tmp_path / "missing.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("[shard\n")
    with pytest.raises(ConfigFileError, match=r"broken\.toml is not valid TOML"):
        read_toml(broken)
