"""A shard's state as replicas send it: bytes and back, bit for bit, for every rule."""

from __future__ import annotations

import pytest
import torch

from psproto import codec
from psproto.layout import Layout
from psserver.core.rules import RULES, RuleSpec
from psserver.core.shard import PushHeader, Shard, ShardConfig
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
