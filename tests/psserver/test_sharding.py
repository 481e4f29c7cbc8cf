from __future__ import annotations

import pytest

from psserver.sharding import shard_index_from_hostname


@pytest.mark.parametrize(
    ("hostname", "shards", "index"),
    [("hetps-shard-0", 2, 0), ("hetps-shard-1", 2, 1), ("ps-12.hetps.default.svc", 16, 12)],
)
def test_ordinal_suffix_is_the_shard_index(hostname: str, shards: int, index: int) -> None:
    assert shard_index_from_hostname(hostname, shards) == index


@pytest.mark.parametrize(
    ("hostname", "shards", "message"),
    [("laptop", 2, "no '-N' ordinal suffix"), ("hetps-shard-3", 2, "--num-shards is 2"), ("ps-1x", 2, "suffix")],
)
def test_unusable_hostnames_are_clear_errors(hostname: str, shards: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        shard_index_from_hostname(hostname, shards)
