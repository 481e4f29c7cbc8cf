"""Lists in configuration files: read as tuples of checked items, written back as TOML arrays."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from pscli.config_file import ConfigFileError, build, dump_toml, read_toml


@dataclass(frozen=True)
class _Lists:
    servers: tuple[str, ...] = ()
    part: tuple[int, int] | None = None


def test_lists_read_as_tuples_and_round_trip(tmp_path: Path) -> None:
    table = {"servers": ["a:1", "b:2"], "part": [0, 4]}
    path = tmp_path / "lists.toml"
    path.write_text(dump_toml(table))
    assert build(_Lists, read_toml(path)) == _Lists(("a:1", "b:2"), (0, 4))


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ({"servers": "a:1"}, "servers must be a list, not 'a:1'"),
        ({"servers": ["a:1", 2]}, "servers must be a string, not 2"),
        ({"part": [0, 1, 2]}, "part must be a list of 2"),
        ({"part": [0, "x"]}, "part must be a whole number, not 'x'"),
    ],
)
def test_a_wrong_list_names_its_key(table: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigFileError, match=says):
        build(_Lists, table)
