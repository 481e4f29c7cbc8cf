"""Shard.status(): an immutable snapshot taken under the lock."""

from __future__ import annotations

import dataclasses

import pytest

from psproto.layout import Layout
from psserver.core.errors import ShardError
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig

LAYOUT = Layout.from_named_shapes([("w", (2, 3))])


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_status_before_any_join() -> None:
    status = Shard(ShardConfig(RuleSpec.parse("asgd", {}))).status()
    assert (status.clock, status.layout_hash, status.initialized, status.shard_length) == (0, "", False, 0)
    assert status.workers == () and dict(status.rejected) == {} and dict(status.procedure_options) == {}


def test_status_is_a_snapshot_that_later_changes_do_not_touch() -> None:
    clock = FakeClock()
    shard = Shard(ShardConfig(RuleSpec.parse("asgd", {})), clock_source=clock)
    worker = shard.join("a", "gpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    shard.heartbeat(worker, {"loss": 2.0})
    with pytest.raises(ShardError):
        shard.heartbeat(99, {})
    clock.now += 5.0
    status = shard.status()
    assert status.layout_hash == LAYOUT.hash and status.shard_length == 6 and status.uptime_seconds == 5.0
    assert dict(status.rejected) == {"unknown_worker": 1}
    (view,) = status.workers
    assert (view.name, view.device, view.observer, view.seconds_since_seen) == ("a", "gpu", False, 5.0)
    assert dict(view.stats) == {"loss": 2.0}

    shard.heartbeat(worker, {"loss": 1.0})
    shard.leave(worker)
    assert dict(view.stats) == {"loss": 2.0} and len(status.workers) == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        status.clock = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        view.stats["loss"] = 0.0  # type: ignore[index]
