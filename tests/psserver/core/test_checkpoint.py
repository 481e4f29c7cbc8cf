"""Checkpoints: what a shard saves comes back exactly, retried pushes stay exactly-once, bad files are refused."""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path

import pytest
import torch

from psproto import codec
from psproto.layout import Layout
from psserver.core import checkpoint, checkpoint_file
from psserver.core.errors import ErrorKind, ShardError
from psserver.core.rules import PayloadKind, RuleSpec
from psserver.core.shard import PushHeader, Shard, ShardConfig, StateError
from psserver.core.workers import PushOutcome

LAYOUT = Layout.from_named_shapes([("w", (2, 3)), ("b", (2,))])
GRADIENT = int(PayloadKind.GRADIENT)


def make_shard(rule: str = "momentum", **config: object) -> Shard:
    return Shard(ShardConfig(RuleSpec.parse(rule, {"lr": "0.5"}), **config))  # type: ignore[arg-type]


def push(shard: Shard, worker_id: int, push_id: int, base_clock: int, values: torch.Tensor) -> PushOutcome:
    return shard.push(PushHeader(worker_id, push_id, base_clock, GRADIENT, LAYOUT.hash, {}), codec.encode(values))


def trained_shard() -> Shard:
    shard = make_shard()
    worker = shard.join("a", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    shard.join("b", "cpu", False, LAYOUT, LAYOUT.hash)
    assembler = shard.begin_upload(worker, LAYOUT.hash)
    for chunk in codec.encode(torch.arange(8, dtype=torch.float32)):
        shard.decode_chunk(assembler, chunk)
    shard.finish_upload(assembler)
    for push_id in range(1, 4):
        push(shard, worker, push_id, shard.clock, torch.ones(8) * push_id)
    return shard


def test_state_round_trips_parameters_rule_state_clocks_and_workers(tmp_path: Path) -> None:
    shard = trained_shard()
    written = checkpoint.write_checkpoint(tmp_path, shard.state_dict(), keep=3)
    restored = make_shard()
    assert checkpoint.restore(restored, tmp_path) == written.path
    assert torch.equal(restored.params, shard.params)
    assert restored.rule is not None and shard.rule is not None
    assert torch.equal(restored.rule.state_tensors()["velocity"], shard.rule.state_tensors()["velocity"])
    assert (restored.clock, restored.applied_pushes, restored.initialized) == (3, 3, True)
    assert sorted(w.name for w in restored.worker_snapshot()) == ["a", "b"]
    # Worker ids survive, so a worker that kept its id goes on without re-joining.
    outcome = push(restored, 1, 4, restored.clock, torch.ones(8))
    assert outcome.clock == 4 and not outcome.duplicate
    # New workers never reuse a saved id.
    assert restored.join("c", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id > 2


def test_a_push_retried_after_a_restore_is_applied_once(tmp_path: Path) -> None:
    shard = trained_shard()
    checkpoint.write_checkpoint(tmp_path, shard.state_dict(), keep=3)
    restored = make_shard()
    checkpoint.restore(restored, tmp_path)
    before = restored.params.clone()
    # The worker re-joins with the same name (its id is unknown to it, say) and retries push 3.
    worker = restored.join("a", "cpu", False, LAYOUT, LAYOUT.hash, resume=True).worker.worker_id
    outcome = push(restored, worker, 3, 2, torch.ones(8))
    assert outcome.duplicate
    assert torch.equal(restored.params, before)
    assert restored.clock == 3


def test_resume_keeps_the_push_memory_and_replaces_the_old_record() -> None:
    shard = trained_shard()
    again = shard.join("a", "cpu", False, LAYOUT, LAYOUT.hash, resume=True).worker
    assert 1 not in {w.worker_id for w in shard.worker_snapshot()}
    assert push(shard, again.worker_id, 2, shard.clock, torch.ones(8)).duplicate
    shard.leave(again.worker_id)
    # Without resume a name no joined worker holds starts afresh: push ids count from the new client.
    fresh = shard.join("a", "cpu", False, LAYOUT, LAYOUT.hash).worker
    assert not push(shard, fresh.worker_id, 2, shard.clock, torch.ones(8)).duplicate


def test_every_nth_update_is_captured_with_its_push_id(tmp_path: Path) -> None:
    shard = trained_shard()
    writer = checkpoint.Checkpointer(shard, tmp_path, keep=2, every_updates=2)
    writer.start()
    try:
        for push_id in range(4, 10):
            push(shard, 1, push_id, shard.clock, torch.ones(8))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and [c for _, c, _ in checkpoint.list_checkpoints(tmp_path)][-1:] != [8]:
            time.sleep(0.05)
    finally:
        writer.stop()
    files = checkpoint.list_checkpoints(tmp_path)
    # Captures the writer had no time for are replaced by newer ones; every one is at a multiple of 2.
    clocks = [clock for _, clock, _ in files]
    assert clocks[-1] == 8 and len(clocks) <= 2 and all(c % 2 == 0 for c in clocks)
    state = checkpoint.read_checkpoint(files[-1][2])
    recent = [pid for pid, *_ in state["memories"]["a"]["recent"]]
    assert recent[-1] == 8  # update 8 was push 8: its id is in the same checkpoint
    assert not list(tmp_path.glob(".*tmp*"))


def test_time_based_checkpoints_only_when_the_clock_moved(tmp_path: Path) -> None:
    shard = trained_shard()
    writer = checkpoint.Checkpointer(shard, tmp_path, keep=5, every_seconds=0.1)
    writer.start()
    try:
        time.sleep(0.3)
        assert not checkpoint.list_checkpoints(tmp_path)  # nothing moved since start (or the restore)
        push(shard, 1, 4, shard.clock, torch.ones(8))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not checkpoint.list_checkpoints(tmp_path):
            time.sleep(0.05)
        time.sleep(0.5)
    finally:
        writer.stop()
    assert len(checkpoint.list_checkpoints(tmp_path)) == 1


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shard = trained_shard()
    first = checkpoint.write_checkpoint(tmp_path, shard.state_dict(), keep=3)
    push(shard, 1, 4, shard.clock, torch.ones(8))
    second = checkpoint.write_checkpoint(tmp_path, shard.state_dict(), keep=3)
    second.path.write_bytes(second.path.read_bytes()[:100])
    leftover = tmp_path / ".ckpt-00000009-clock-9.pt.tmp-1"
    leftover.write_bytes(b"half")
    restored = make_shard()
    with caplog.at_level(logging.WARNING, logger="psserver.core.checkpoint"):
        assert checkpoint.restore(restored, tmp_path) == first.path
    assert restored.clock == 3
    assert not list(tmp_path.glob(".*tmp*"))
    assert f"removed {leftover}" in caplog.text
    assert f"skipping damaged checkpoint {second.path} (truncated" in caplog.text


def test_only_damaged_checkpoints_refuse_to_start(tmp_path: Path) -> None:
    (tmp_path / "ckpt-00000001-clock-5.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(checkpoint.CheckpointError, match="none can be read") as caught:
        checkpoint.restore(make_shard(), tmp_path)
    assert "ckpt-00000001-clock-5.pt: unreadable" in str(caught.value)


def test_a_checkpoint_of_another_rule_or_shard_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    checkpoint.write_checkpoint(tmp_path, trained_shard().state_dict(), keep=3)
    for other in (make_shard("asgd"), make_shard(shard_index=1, num_shards=2)):
        with pytest.raises(StateError, match="same --rule"):
            checkpoint.restore(other, tmp_path)
        assert other.layout is None and other.clock == 0 and not other.workers


def test_an_empty_directory_restores_nothing(tmp_path: Path) -> None:
    shard = make_shard()
    assert checkpoint.restore(shard, tmp_path / "missing") is None
    assert shard.clock == 0


def test_limits_on_workers_and_parameters() -> None:
    shard = make_shard(max_workers=2)
    shard.join("a", "cpu", False, LAYOUT, LAYOUT.hash)
    shard.join("b", "cpu", False, LAYOUT, LAYOUT.hash)
    with pytest.raises(ShardError) as caught:
        shard.join("c", "cpu", False, LAYOUT, LAYOUT.hash)
    assert caught.value.kind is ErrorKind.LIMIT_REACHED and "shard.max_workers" in caught.value.message
    # A worker re-joining under its own name is not a new one.
    shard.join("b", "cpu", False, LAYOUT, LAYOUT.hash, resume=True)
    small = make_shard(max_parameters=4)
    with pytest.raises(ShardError) as caught:
        small.join("a", "cpu", False, LAYOUT, LAYOUT.hash)
    assert caught.value.kind is ErrorKind.LIMIT_REACHED and "shard.max_parameters" in caught.value.message
    assert small.layout is None and not small.workers


@pytest.mark.parametrize("rule", ["ormo", "ormo-da"])
def test_ormo_tags_survive_a_restore_so_a_workers_lag_is_unchanged(tmp_path: Path, rule: str) -> None:
    def started() -> tuple[Shard, int, int]:
        shard = make_shard(rule)
        a = shard.join("a", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
        b = shard.join("b", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
        assembler = shard.begin_upload(a, LAYOUT.hash)
        for chunk in codec.encode(torch.arange(8, dtype=torch.float32)):
            shard.decode_chunk(assembler, chunk)
        shard.finish_upload(assembler)
        shard.pull(a, 0)
        shard.pull(b, 0)  # both tagged with iteration 0
        assert push(shard, a, 1, 0, torch.ones(8)).telemetry["lag"] == 0.0  # fresh: iteration 0 -> 1
        return shard, a, b

    running, _, b = started()
    uninterrupted = push(running, b, 1, 0, torch.full((8,), 2.0))
    assert uninterrupted.telemetry["lag"] == 1.0

    before_restart, _, b = started()
    checkpoint.write_checkpoint(tmp_path, before_restart.state_dict(), keep=3)  # read back with weights_only
    restored = make_shard(rule)
    checkpoint.restore(restored, tmp_path)
    after_restart = push(restored, b, 1, 0, torch.full((8,), 2.0))
    assert after_restart.telemetry["lag"] == uninterrupted.telemetry["lag"]
    assert after_restart.telemetry["iteration"] == uninterrupted.telemetry["iteration"]
    torch.testing.assert_close(restored.params, running.params)
    assert restored.rule is not None and restored.rule.state_tensors()["tags"].tolist() == [[1, 0], [2, 0]]


def test_an_ormo_state_saved_without_tags_restores_every_worker_fresh() -> None:
    shard = make_shard("ormo")
    worker = shard.join("a", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    assembler = shard.begin_upload(worker, LAYOUT.hash)
    for chunk in codec.encode(torch.zeros(8)):
        shard.decode_chunk(assembler, chunk)
    shard.finish_upload(assembler)
    shard.pull(worker, 0)
    state = shard.state_dict()
    del state["rule_state"]["tags"]  # as written before the tags were saved
    restored = make_shard("ormo")
    restored.load_state_dict(state)
    assert restored.rule is not None and restored.rule.state_tensors()["tags"].shape == (0, 2)
    bad = shard.state_dict()
    bad["rule_state"]["tags"] = torch.zeros(3)
    with pytest.raises(StateError, match="tags"):
        make_shard("ormo").load_state_dict(bad)


# --- The file format: a SHA-256 header over the torch.save payload ---------------------------


def _alter(path: Path, offset: int, count: int = 40) -> None:
    """Flip ``count`` bytes from ``offset`` in place: same length, different content (bit rot)."""
    data = bytearray(path.read_bytes())
    size = len(data)
    for i in range(offset, min(offset + count, size)):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))
    assert path.stat().st_size == size


def test_a_checkpoint_carries_the_sha256_of_its_payload(tmp_path: Path) -> None:
    written = checkpoint.write_checkpoint(tmp_path, trained_shard().state_dict(), keep=3)
    data = written.path.read_bytes()
    magic, version, digest_kind, length, digest = checkpoint_file.HEADER.unpack(data[: checkpoint_file.HEADER.size])
    payload = data[checkpoint_file.HEADER.size :]
    assert (magic, version, digest_kind) == (b"HETPSCKP", 1, 1)
    assert length == len(payload) and digest == hashlib.sha256(payload).digest()
    assert checkpoint_file.verify(written.path) == checkpoint_file.Verdict("ok")
    assert checkpoint_file.read_state(written.path)[1] is True


@pytest.mark.parametrize(
    ("where", "problem"),
    [
        ("digest", "checksum mismatch"),
        ("payload start", "checksum mismatch"),
        ("payload middle", "checksum mismatch"),
        ("payload end", "checksum mismatch"),
        ("length", "truncated"),
        ("version", "unknown checkpoint file version"),
        ("magic", "unreadable"),
    ],
)
def test_bytes_changed_anywhere_are_detected(tmp_path: Path, where: str, problem: str) -> None:
    path = checkpoint.write_checkpoint(tmp_path, trained_shard().state_dict(), keep=3).path
    size, header = path.stat().st_size, checkpoint_file.HEADER.size
    offset, count = {
        "digest": (header - 32, 4),
        "payload start": (header, 40),
        "payload middle": ((header + size) // 2 - 20, 40),
        "payload end": (size - 40, 40),
        "length": (18, 1),  # a far larger length than the bytes that follow
        "version": (8, 1),
        "magic": (0, 3),  # no longer our header: read as the previous format, which it is not
    }[where]
    _alter(path, offset, count)
    with pytest.raises(checkpoint.DamagedCheckpointError, match=problem) as caught:
        checkpoint.read_checkpoint(path)
    assert caught.value.path == path and str(path) in str(caught.value)
    verdict = checkpoint_file.verify(path)
    assert verdict.status == "damaged" and verdict.problem is not None and problem in verdict.problem


@pytest.mark.parametrize("keep_bytes", [0, 5, checkpoint_file.HEADER.size - 1, checkpoint_file.HEADER.size + 10])
def test_a_truncated_checkpoint_is_damaged(tmp_path: Path, keep_bytes: int) -> None:
    path = checkpoint.write_checkpoint(tmp_path, trained_shard().state_dict(), keep=3).path
    path.write_bytes(path.read_bytes()[:keep_bytes])
    with pytest.raises(checkpoint.DamagedCheckpointError, match="truncated"):
        checkpoint.read_checkpoint(path)
    assert checkpoint_file.verify(path).status == "damaged"


def test_bytes_appended_to_a_checkpoint_are_damage(tmp_path: Path) -> None:
    path = checkpoint.write_checkpoint(tmp_path, trained_shard().state_dict(), keep=3).path
    path.write_bytes(path.read_bytes() + b"junk")
    with pytest.raises(checkpoint.DamagedCheckpointError, match="4 bytes longer than written"):
        checkpoint.read_checkpoint(path)


def test_a_checkpoint_of_the_previous_format_is_restored_unverified(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shard = trained_shard()
    old = tmp_path / "ckpt-00000001-clock-3.pt"
    torch.save(shard.state_dict(), old)  # the format before checksums: a bare torch.save
    assert checkpoint_file.verify(old) == checkpoint_file.Verdict("unverified")
    restored = make_shard()
    with caplog.at_level(logging.WARNING, logger="psserver.core.checkpoint"):
        assert checkpoint.restore(restored, tmp_path) == old
    assert torch.equal(restored.params, shard.params) and restored.clock == 3
    assert f"checkpoint {old} has no checksum" in caplog.text
    # The next one is written in the new format after it, and both are listed as such.
    checkpoint.write_checkpoint(tmp_path, restored.state_dict(), keep=3)
    assert [r.verdict.status for r in checkpoint.inspect_directory(tmp_path)] == ["unverified", "ok"]
    # A previous-format file that does not load is damaged, not unverified.
    _alter(old, old.stat().st_size // 2)
    assert checkpoint_file.verify(old).status == "damaged"


def test_a_newest_checkpoint_altered_in_the_middle_falls_back_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    shard = trained_shard()
    first = checkpoint.write_checkpoint(tmp_path, shard.state_dict(), keep=3)
    params_at_3 = shard.params.clone()
    push(shard, 1, 4, shard.clock, torch.ones(8))
    second = checkpoint.write_checkpoint(tmp_path, shard.state_dict(), keep=3)
    _alter(second.path, second.path.stat().st_size // 2)
    restored = make_shard()
    with caplog.at_level(logging.WARNING, logger="psserver.core.checkpoint"):
        assert checkpoint.restore(restored, tmp_path) == first.path
    assert restored.clock == 3 and torch.equal(restored.params, params_at_3)
    assert f"skipping damaged checkpoint {second.path} (checksum mismatch" in caplog.text
    reports = checkpoint.inspect_directory(tmp_path)
    assert [(r.clock, r.verdict.status) for r in reports] == [(3, "ok"), (4, "damaged")]
    assert reports[1].size == second.path.stat().st_size and reports[1].modified > 0


def test_every_checkpoint_damaged_refuses_and_names_each(tmp_path: Path) -> None:
    shard = trained_shard()
    paths = [checkpoint.write_checkpoint(tmp_path, shard.state_dict(), keep=3).path for _ in range(2)]
    for path in paths:
        _alter(path, path.stat().st_size // 2)
    restored = make_shard()
    with pytest.raises(checkpoint.CheckpointError, match="2 checkpoint file") as caught:
        checkpoint.restore(restored, tmp_path)
    assert all(f"{p.name}: checksum mismatch" in str(caught.value) for p in paths)
    assert restored.clock == 0 and restored.layout is None


def test_a_file_where_the_folder_should_be_is_a_checkpoint_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    state = trained_shard().state_dict()
    for directory in (blocker, blocker / "below"):
        with pytest.raises(checkpoint.CheckpointError, match="cannot write a checkpoint"):
            checkpoint.write_checkpoint(directory, state, keep=3)
        with pytest.raises(checkpoint.CheckpointError, match=r"cannot use|not a directory"):
            checkpoint.restore(make_shard(), directory)
    # The admin RPC and shutdown go through write_now: the same error, counted.
    writer = checkpoint.Checkpointer(trained_shard(), blocker)
    with pytest.raises(checkpoint.CheckpointError, match="could not be written"):
        writer.write_now()
    assert writer.failures == 1
    assert blocker.read_text() == "not a folder"


def test_a_failed_write_leaves_no_temporary(tmp_path: Path) -> None:
    state = trained_shard().state_dict()
    state["bad"] = lambda: None  # torch.save cannot pickle it: fails mid-write, not at the disk
    with pytest.raises(Exception, match=r"pickle|lambda"):
        checkpoint.write_checkpoint(tmp_path, state, keep=3)
    assert list(tmp_path.iterdir()) == []
