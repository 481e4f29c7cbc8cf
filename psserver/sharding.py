"""Which shard this process serves when it is one pod of a StatefulSet."""

from __future__ import annotations

import re

_ORDINAL = re.compile(r"-(\d+)$")


def shard_index_from_hostname(hostname: str, num_shards: int) -> int:
    """The ordinal suffix of a StatefulSet pod name (``hetps-shard-2`` -> 2), checked against the shard count."""
    match = _ORDINAL.search(hostname.split(".", maxsplit=1)[0])
    if match is None:
        raise ValueError(
            f"hostname {hostname!r} has no '-N' ordinal suffix; pass --shard-index explicitly "
            "or run as a StatefulSet pod"
        )
    index = int(match.group(1))
    if index >= num_shards:
        raise ValueError(f"hostname {hostname!r} gives shard index {index}, but --num-shards is {num_shards}")
    return index
