"""Parameter versions for gap-measuring rules: shared per clock, freed when unused, capped in memory."""

from __future__ import annotations

import logging

import pytest
import torch

from psproto import codec
from psproto.layout import Layout
from psproto.v1 import ps_pb2
from psserver.core.observer import NullObserver
from psserver.core.rules import RuleSpec
from psserver.core.shard import PushHeader, Shard, ShardConfig
from psserver.core.snapshots import SnapshotStore

LAYOUT = Layout.from_named_shapes([("w", (4,))])
FP32 = ps_pb2.DTYPE_FLOAT32


def test_the_cap_drops_the_oldest_versions() -> None:
    store = SnapshotStore(memory_cap_bytes=2 * 4 * 4)  # two versions of four fp32 elements
    for clock in range(4):
        store.keep(clock, torch.full((4,), float(clock)))
    assert len(store) == 2 and store.get(0) is None and store.get(1) is None
    assert torch.equal(store.get(3), torch.full((4,), 3.0))  # type: ignore[arg-type]
    assert store.dropped_for_memory == 2
    store.retain_only([3])
    assert len(store) == 1 and store.bytes_held == 16


def test_every_drop_for_memory_is_returned_and_logged_with_the_cap_and_the_flag(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = SnapshotStore(memory_cap_bytes=2 * 4 * 4)
    with caplog.at_level(logging.WARNING, logger="psserver.core.snapshots"):
        assert store.keep(0, torch.zeros(4)) == []
        assert store.keep(1, torch.zeros(4)) == []
        assert not caplog.records
        assert store.keep(2, torch.zeros(4)) == [0]
        assert store.keep(3, torch.zeros(4)) == [1]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # one per dropped version
    message = warnings[0].getMessage()
    assert "clock 0" in message and "0.0 MiB" in message and "shard.snapshot_memory_bytes" in message


class _DropRecorder(NullObserver):
    def __init__(self) -> None:
        self.dropped: list[int] = []

    def snapshot_dropped(self, clock: int) -> None:
        self.dropped.append(clock)


def _shard(rule: str, cap_bytes: int = 1 << 30, observer: NullObserver | None = None) -> tuple[Shard, list[int]]:
    config = ShardConfig(RuleSpec.parse(rule, {"lr": "0.1"}), snapshot_memory_bytes=cap_bytes)
    shard = Shard(config, observer=observer)
    ids = [shard.join(f"w{i}", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id for i in range(3)]
    assembler = shard.begin_upload(ids[0], LAYOUT.hash)
    for chunk in codec.encode(torch.zeros(4)):
        shard.decode_chunk(assembler, chunk)
    shard.finish_upload(assembler)
    return shard, ids


def _push(shard: Shard, worker: int, push_id: int) -> None:
    shard.push(
        PushHeader(worker, push_id, shard.workers[worker].pulled_clock, 1, LAYOUT.hash, {}), codec.encode(torch.ones(4))
    )


def test_versions_are_kept_only_for_rules_that_need_them_and_only_while_pulled() -> None:
    plain, ids = _shard("asgd")
    plain.pull(ids[0], FP32)
    assert len(plain.snapshots) == 0
    gap, ids = _shard("gap-aware")
    gap.pull(ids[0], FP32)
    gap.pull(ids[1], FP32)  # same clock: one shared version
    assert len(gap.snapshots) == 1
    _push(gap, ids[0], 1)
    gap.pull(ids[0], FP32)  # worker 0 moves on; worker 1 still needs clock 0
    assert len(gap.snapshots) == 2
    _push(gap, ids[1], 1)
    gap.pull(ids[1], FP32)  # workers now hold clocks 1 and 2: nobody needs clock 0
    assert len(gap.snapshots) == 2 and gap.snapshots.get(0) is None
    gap.leave(ids[0])
    gap.leave(ids[1])
    assert len(gap.snapshots) == 0


def test_a_push_whose_version_was_dropped_for_memory_is_reported() -> None:
    recorder = _DropRecorder()
    shard, ids = _shard("gap-aware", cap_bytes=16, observer=recorder)  # room for one version
    shard.pull(ids[0], FP32)
    shard.pull(ids[1], FP32)
    _push(shard, ids[1], 1)
    shard.pull(ids[1], FP32)  # clock 1: the cap drops clock 0, which worker 0 still needs
    outcome = shard.push(PushHeader(ids[0], 1, 0, 1, LAYOUT.hash, {}), codec.encode(torch.ones(4)))
    assert outcome.staleness == 1
    assert outcome.telemetry.get("snapshot_missing") == 1.0
    assert "gap" not in outcome.telemetry
    assert shard.snapshots.dropped_for_memory == 1
    assert recorder.dropped == [0]  # the shard told its observer (metrics) about the drop
