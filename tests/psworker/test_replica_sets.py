"""A shard's servers as a replica set: ``HOST:PORT|HOST:PORT`` entries, parsed and checked before
anything connects, by the library (``PSClient``, ``TrainConfig``) and ``psworker train`` (exit 2)."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner

from pstasks.cli import main
from psworker.channels import replica_sets, shard_addresses
from psworker.train import TrainConfig


def test_an_entry_is_a_shard_and_its_replicas_are_separated_by_a_bar() -> None:
    assert shard_addresses("127.0.0.1:1", 1) == [("127.0.0.1:1",)]
    entries = ["a:1|b:1|c:1", "d:1", " e:1 | f:1 "]
    assert shard_addresses(entries, 3) == [("a:1", "b:1", "c:1"), ("d:1",), ("e:1", "f:1")]


@pytest.mark.parametrize(
    ("entries", "says"),
    [
        (["a:1|"], "server entry 'a:1|' has an empty address; give HOST:PORT, or a shard's replicas as HOST:PORT|"),
        (["|a:1"], "server entry '|a:1' has an empty address"),
        (["a:1||b:1"], "server entry 'a:1||b:1' has an empty address"),
        ([""], "server entry '' has an empty address"),
        (["a:1|a:1"], "a:1 listed more than once"),
        (["a:1|b:1", "c:1|b:1"], "b:1 listed more than once; give each shard's address once"),
        (["a:1", "b:1|a:1"], "a:1 listed more than once"),
    ],
)
def test_an_empty_member_or_an_address_given_twice_is_refused_naming_it(entries: list[str], says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        replica_sets(entries)
    with pytest.raises(ValueError, match=r"empty address|listed more than once"):
        TrainConfig(servers=tuple(entries))


def test_the_number_of_entries_is_the_number_of_shards_whatever_the_replicas() -> None:
    with pytest.raises(ValueError, match=r"^1 server address\(es\) for a layout of 2 shard\(s\)"):
        shard_addresses(["a:1|b:1"], 2)


def test_psworker_train_refuses_a_wrong_replica_set_with_exit_2() -> None:
    # 127.0.0.1:9 (discard) is never contacted: the servers are checked first.
    result = CliRunner().invoke(main, ["train", "--server", "127.0.0.1:9|", "--max-steps", "1"])
    assert result.exit_code == 2, result.output
    assert "server entry '127.0.0.1:9|' has an empty address" in " ".join(result.output.split())
    twice = CliRunner().invoke(main, ["train", "--server", "127.0.0.1:9|127.0.0.1:9", "--max-steps", "1"])
    assert twice.exit_code == 2 and "127.0.0.1:9 listed more than once" in twice.output, twice.output
