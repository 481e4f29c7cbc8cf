"""Lists in configuration files: read as tuples of checked items, written back as TOML arrays."""

from __future__ import annotations

from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class _Item:
    name: str
    weights: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class _Items:
    items: tuple[_Item, ...] = ()


def test_a_list_of_tables_reads_each_table_and_names_a_wrong_one_by_its_place(tmp_path: Path) -> None:
    path = tmp_path / "items.toml"
    path.write_text('[[items]]\nname = "a"\nweights = { x = 1, y = 0.5 }\n[[items]]\nname = "b"\n')
    assert build(_Items, read_toml(path)) == _Items((_Item("a", {"x": 1.0, "y": 0.5}), _Item("b")))
    with pytest.raises(ConfigFileError, match=r"unknown key items\[1\]\.nam;"):
        build(_Items, {"items": [{"name": "a"}, {"nam": "b"}]})
    with pytest.raises(ConfigFileError, match=r"items\[0\]\.weights\.x must be a number, not 'heavy'"):
        build(_Items, {"items": [{"name": "a", "weights": {"x": "heavy"}}]})
    with pytest.raises(ConfigFileError, match=r"items\[0\]\.weights must be a table"):
        build(_Items, {"items": [{"name": "a", "weights": [1]}]})
