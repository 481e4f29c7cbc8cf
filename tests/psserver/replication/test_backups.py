"""The primary's bookkeeping of versions, without backups or etcd."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psserver.replication.backups import Replicator
from psserver.replication.config import ReplicationConfig
from psserver.replication.coordinator import Coordinator, PrimaryRecord


def test_a_primary_without_backups_keeps_no_history_of_its_versions() -> None:
    coordinator = cast(Coordinator, SimpleNamespace(config=ReplicationConfig(etcd=("http://127.0.0.1:2379",))))
    replicator = Replicator(
        Shard(ShardConfig(RuleSpec.parse("asgd", {}))), coordinator, PrimaryRecord("a", "h:1", 1), print
    )
    for _ in range(1000):
        replicator.versions.changed()
    assert replicator.versions.version == 1000
    # Every version is held by every backup (there is none): nothing is kept to measure lag against.
    assert replicator.versions.changed_at(1) is None
    assert replicator.backups() == []
    replicator.close("test over")
