"""A shard's state as replicas send it: bytes and back, bit for bit, for every rule."""

from __future__ import annotations

import io
import json
import struct
from typing import Any

import pytest
import torch

from psproto import codec
from psproto.layout import Layout
from psserver.core.rules import RULES, RuleSpec
from psserver.core.shard import PushHeader, Shard, ShardConfig
from psserver.core.workers import RECENT_PUSHES_KEPT
from psserver.replication import state_wire

LAYOUT = Layout.from_named_shapes([("w", (3, 5)), ("b", (7,))])


def _trained(rule: str) -> Shard:
    spec = RuleSpec.parse(rule, {})
    shard = Shard(ShardConfig(spec))
    worker = shard.join("a", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    shard.join("b", "cpu", False, LAYOUT, LAYOUT.hash)
    assembler = shard.begin_upload(worker, LAYOUT.hash)
    for chunk in codec.encode(torch.linspace(-1, 1, LAYOUT.total_length)):
        shard.decode_chunk(assembler, chunk)
    shard.finish_upload(assembler)
    kind = int(min(spec.rule.accepted_kinds))
    generator = torch.Generator().manual_seed(0)
    for push_id in range(1, 4):
        shard.pull(worker, codec.FLOAT32)
        values = torch.randn(LAYOUT.total_length, generator=generator)
        header = PushHeader(worker, push_id, shard.clock, kind, LAYOUT.hash, {})
        shard.push(header, codec.encode(values))
    return shard


def _sent(state: dict[str, object]) -> dict[str, object]:
    """``state`` sent as a backup receives it: into a buffer of its own (aligned as torch allocates)."""
    data = b"".join(bytes(part) for part in state_wire.encode(state).parts)  # type: ignore[arg-type]
    buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8).clone() if data else torch.empty(0, dtype=torch.uint8)
    return state_wire.decode(state_wire.bytes_of(buffer))


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return isinstance(b, list | tuple) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


@pytest.mark.parametrize("rule", sorted(RULES))
def test_a_backup_that_takes_over_holds_the_primarys_state_bit_for_bit(rule: str) -> None:
    primary = _trained(rule)
    backup = Shard(ShardConfig(RuleSpec.parse(rule, {})))
    backup.load_state_dict(_sent(primary.state_dict()))
    theirs, ours = primary.state_dict(), backup.state_dict()
    for state in (theirs, ours):
        state.pop("written_at")
        for worker in state.get("workers", []):
            worker.pop("last_seen", None)  # the time each replica saw the worker, not state
    assert _same(theirs, ours)
    assert state_wire.encode(primary.state_dict()).digest() != ""


def test_tensors_come_back_aligned_and_of_their_dtype() -> None:
    state = {"params": torch.arange(5, dtype=torch.float32), "rule_state": {"n": torch.arange(3), "e": torch.empty(0)}}
    back = _sent({**state, "clock": 2})
    assert back["clock"] == 2
    params = back["params"]
    assert isinstance(params, torch.Tensor) and params.data_ptr() % 64 == 0
    assert _same(back["rule_state"], state["rule_state"])


def test_a_truncated_or_padded_state_is_refused() -> None:
    encoded = state_wire.encode({"params": torch.ones(100), "rule_state": {}})
    data = b"".join(bytes(part) for part in encoded.parts)
    for damaged in (data[:-4], data + b"\0", data[:5], b""):
        with pytest.raises(ValueError, match="replica state"):
            state_wire.decode(damaged)


def test_the_digest_tells_one_changed_bit() -> None:
    params = torch.ones(10)
    before = state_wire.encode({"params": params, "rule_state": {}}).digest()
    params.view(torch.int32)[3] ^= 1
    assert state_wire.encode({"params": params, "rule_state": {}}).digest() != before


def _as_an_earlier_release_sent(state: dict[str, Any]) -> bytes:
    """``state`` in the earlier form: the description a ``torch.save``, the tensors as now."""
    encoded = state_wire.encode(state)
    head = bytes(encoded.parts[1])
    described = json.loads(head)
    saved = io.BytesIO()
    torch.save(described, saved)
    old_head = saved.getvalue()
    parts = [struct.pack("<Q", len(old_head)), old_head]
    offset = 8 + len(old_head)
    for tensor in [state["params"], *state["rule_state"].values()]:
        raw = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        parts += [bytes(-offset % 64), raw]
        offset += -offset % 64 + len(raw)
    return b"".join(parts)


def test_a_state_from_an_earlier_release_is_still_read() -> None:
    # During a rolling upgrade a backup of this release takes the state of a primary of the last.
    primary = _trained("gap-aware")
    state = primary.state_dict()
    data = _as_an_earlier_release_sent(state)
    assert data[8:10] == b"PK", "a torch.save (zip) description"
    back = state_wire.decode(bytearray(data))
    assert _same(back["params"], state["params"]) and _same(back["rule_state"], state["rule_state"])
    assert back["memories"] == json.loads(json.dumps(state["memories"]))
    assert back["clock"] == state["clock"] == 3


def _framed(head: bytes) -> bytes:
    return struct.pack("<Q", len(head)) + head


def test_the_description_travels_as_json_and_a_wrong_one_is_refused() -> None:
    encoded = state_wire.encode({"params": torch.ones(4), "rule_state": {}, "clock": 7})
    assert json.loads(bytes(encoded.parts[1]))["clock"] == 7
    listed = io.BytesIO()
    torch.save([1, 2], listed)
    for head, says in ((b"{oops", "damaged"), (listed.getvalue(), "not a table"), (b"\x80junk", "neither JSON")):
        with pytest.raises(ValueError, match="a damaged replica state") as refused:
            state_wire.decode(_framed(head))
        assert says in str(refused.value), refused.value


def test_the_description_stops_growing_once_the_workers_memories_are_full() -> None:
    # Every version a primary sends carries it: it must not grow with the pushes applied.
    shard = _trained("asgd")
    worker = next(iter(shard.worker_snapshot())).worker_id
    sizes = []
    for push_id in range(4, 4 + 3 * RECENT_PUSHES_KEPT):
        shard.pull(worker, codec.FLOAT32)
        shard.push(PushHeader(worker, push_id, shard.clock, 1, LAYOUT.hash, {}), codec.encode(torch.ones(22)))
        sizes.append(state_wire.encode(shard.state_dict()).parts[1].nbytes)
    full = sizes[RECENT_PUSHES_KEPT]
    assert max(sizes[RECENT_PUSHES_KEPT:]) - min(sizes[RECENT_PUSHES_KEPT:]) < 0.05 * full, (full, max(sizes))
    assert full < 10_000, "about 50 bytes a remembered push, 64 of them"
