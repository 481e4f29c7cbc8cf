"""An update applied span by span as its reply is built gives exactly the update applied whole."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import pytest
import torch

from psproto import codec
from psproto.layout import Layout
from psserver.core import span_apply
from psserver.core.model import Model
from psserver.core.observer import NullObserver
from psserver.core.refusals import Refusals
from psserver.core.rules import RULES, PayloadKind, PushContext, RuleSpec
from psserver.core.serialized_pull import PullEncoder
from psserver.core.shard import Shard, ShardConfig
from psserver.core.snapshots import SnapshotStore
from psserver.core.span_apply import SpanApply

SPANNABLE = sorted(name for name, rule in RULES.items() if rule.spannable)
LENGTH = 3 * 64 + 5
LAYOUT = Layout.from_named_shapes([("w", (LENGTH,))])


def _context(kind: PayloadKind, staleness: int = 3) -> PushContext:
    return PushContext(worker_id=1, staleness=staleness, kind=kind, segments=((0, LENGTH),), metadata={}, clock=9)


def _tensors(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(LENGTH, generator=generator), torch.randn(LENGTH, generator=generator)


def test_the_spannable_rules_are_the_elementwise_stateless_ones() -> None:
    assert SPANNABLE == ["asgd", "dynsgd", "sa"]


@pytest.mark.parametrize("name", SPANNABLE)
@pytest.mark.parametrize("span", [1, 7, 64, LENGTH + 1])
def test_a_spannable_rule_applied_span_by_span_gives_the_whole_apply(name: str, span: int) -> None:
    for kind in RULES[name].accepted_kinds:
        params, update = _tensors(span)
        whole = params.clone()
        rule = RuleSpec.parse(name, {"lr": "0.3"}).build(LENGTH)
        telemetry = rule.apply(whole, update.clone(), _context(kind))
        released: list[bool] = []
        pending = SpanApply(rule, params, update, _context(kind), partial(released.append, True), span)
        pending.through(LENGTH // 2)
        assert pending.finished == bool(released) == (span >= LENGTH)  # one span may be the whole shard
        pending.finish()
        assert torch.equal(params, whole), (name, kind)
        assert released == [True] and pending.finished
        # Its telemetry depends on the push's context alone: an empty span gives it.
        assert rule.apply(params[:0], update[:0], _context(kind)) == telemetry


def test_each_span_is_applied_once_and_the_buffer_given_back_once() -> None:
    calls: list[int] = []
    rule = RuleSpec.parse("asgd", {"lr": "1.0"}).build(LENGTH)
    original = rule.apply

    def counted(params: torch.Tensor, update: torch.Tensor, ctx: PushContext) -> dict[str, float]:
        calls.append(params.numel())
        return original(params, update, ctx)

    rule.apply = counted  # type: ignore[method-assign]
    params, update = torch.zeros(LENGTH), torch.ones(LENGTH)
    released: list[bool] = []
    pending = SpanApply(rule, params, update, _context(PayloadKind.GRADIENT), lambda: released.append(True), 64)
    pending.through(10)
    assert calls == [64] and torch.equal(params[:64], -torch.ones(64)) and torch.equal(params[64:], torch.zeros(133))
    pending.through(64)
    pending.through(65)
    assert calls == [64, 64]
    pending.finish()
    pending.finish()
    pending.through(LENGTH)
    assert calls == [64, 64, 64, 5] and released == [True]
    assert torch.equal(params, -torch.ones(LENGTH))


def test_a_rule_that_needs_the_whole_shard_is_never_applied_by_span() -> None:
    rule = RuleSpec.parse("momentum", {"lr": "0.1"}).build(LENGTH)
    with pytest.raises(ValueError, match="not spannable"):
        SpanApply(rule, torch.zeros(LENGTH), torch.zeros(LENGTH), _context(PayloadKind.GRADIENT), lambda: None)


# -- the shard ----------------------------------------------------------------------------------


class _RawEncoder:
    """A reply message that is just the chunk's bytes (the transport's encoder adds headers)."""

    def encode(self, clock: int, total_length: int, chunk: codec.ChunkPayload) -> bytes:
        return bytes(chunk.data)


RAW: PullEncoder = _RawEncoder()


@pytest.fixture(autouse=True)
def small_spans(monkeypatch: pytest.MonkeyPatch) -> None:
    """Spans of 50 elements and replies of 64 (``_shard``): the two need not line up."""
    monkeypatch.setattr(span_apply, "SPAN_ELEMENTS", 50)


def _shard(during_reply: bool, rule: str = "asgd") -> tuple[Shard, list[int]]:
    shard = Shard(ShardConfig(RuleSpec.parse(rule, {"lr": "0.5"}), chunk_bytes=256, apply_during_reply=during_reply))
    workers = [shard.join(name, "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id for name in ("a", "b")]
    assembler = shard.begin_upload(workers[0], LAYOUT.hash)
    for chunk in codec.encode(torch.arange(LENGTH, dtype=torch.float32)):
        shard.decode_chunk(assembler, chunk)
    shard.finish_upload(assembler)
    return shard, workers


def _push(shard: Shard, worker: int, push_id: int, base_clock: int, seed: int, replies: bool = True) -> None:
    pending = shard.begin_push(
        worker, push_id, base_clock, int(PayloadKind.GRADIENT), LAYOUT.hash, {}, pull_dtype=1 if replies else None
    )
    for chunk in codec.encode(_tensors(seed)[1], chunk_bytes=128):
        shard.add_chunk(pending, chunk)
    shard.commit_push(pending)
    shard.discard_push(pending)


def _read(shard: Shard, worker: int) -> torch.Tensor:
    result = shard.pull(worker, codec.FLOAT32, encoder=RAW)
    return torch.frombuffer(bytearray(b"".join(result.messages)), dtype=torch.float32)


def _both(step: Callable[[Shard, list[int]], torch.Tensor | None]) -> None:
    """``step`` on a shard applying whole and one applying during the reply: the same results."""
    results = []
    for during_reply in (False, True):
        shard, workers = _shard(during_reply)
        results.append((step(shard, workers), shard.params.clone(), shard.clock))
    (read_whole, params_whole, clock_whole), (read_during, params_during, clock_during) = results
    assert clock_whole == clock_during
    assert torch.equal(params_whole, params_during)
    if read_whole is not None:
        assert read_during is not None and torch.equal(read_whole, read_during)


def test_a_pushpull_reply_carries_the_parameters_its_push_produced_either_way() -> None:
    def step(shard: Shard, workers: list[int]) -> torch.Tensor:
        read = []
        for push_id in range(1, 4):
            for index, worker in enumerate(workers):
                _push(shard, worker, push_id, shard.clock - index, seed=10 * push_id + index)
                read.append(_read(shard, worker))
        return torch.stack(read)

    _both(step)


def test_a_reply_never_read_is_finished_by_the_next_push_or_pull() -> None:
    def step(shard: Shard, workers: list[int]) -> torch.Tensor:
        _push(shard, workers[0], 1, 0, seed=1)
        shard.pull(workers[0], codec.FLOAT32, encoder=RAW)  # the reply, never read
        _push(shard, workers[1], 1, 0, seed=2)
        return _read(shard, workers[1])

    _both(step)


def test_a_reply_half_read_when_the_next_push_lands_still_carries_its_own_version() -> None:
    def step(shard: Shard, workers: list[int]) -> torch.Tensor:
        _push(shard, workers[0], 1, 0, seed=7)
        # Held while it is sent, as the transport holds it: the shard freezes it before a change.
        reply = shard.pull(workers[0], codec.FLOAT32, encoder=RAW)
        messages = iter(reply.messages)
        first = [next(messages), next(messages)]
        _push(shard, workers[1], 1, 0, seed=8)
        return torch.frombuffer(bytearray(b"".join([*first, *messages])), dtype=torch.float32)

    _both(step)


def test_a_checkpoint_holds_the_whole_pending_update() -> None:
    def step(shard: Shard, workers: list[int]) -> torch.Tensor:
        _push(shard, workers[0], 1, 0, seed=3)
        return shard.state_dict()["params"].clone()

    _both(step)


def test_the_receive_buffer_is_held_until_the_reply_is_read_but_not_against_its_worker() -> None:
    shard, workers = _shard(True)
    _push(shard, workers[0], 1, 0, seed=4)
    buffers = shard._receiver.buffers
    assert buffers.in_use == 1 and buffers.held_by("a") == 0
    messages = iter(shard.pull(workers[0], codec.FLOAT32, encoder=RAW).messages)
    next(messages)
    assert buffers.in_use == 1
    list(messages)
    assert buffers.in_use == 0


def test_an_abandoned_reply_is_finished_when_its_call_ends() -> None:
    shard, workers = _shard(True)
    _push(shard, workers[0], 1, 0, seed=5)
    shard.settle_apply()
    assert shard._receiver.buffers.in_use == 0
    whole, _ = _shard(False)
    _push(whole, workers[0], 1, 0, seed=5)
    assert torch.equal(shard.params, whole.params)


@pytest.mark.parametrize(("rule", "replies"), [("asgd", False), ("momentum", True)])
def test_a_plain_push_or_a_rule_that_needs_the_whole_shard_applies_at_once(rule: str, replies: bool) -> None:
    shard, workers = _shard(True, rule)
    _push(shard, workers[0], 1, 0, seed=6, replies=replies)
    assert shard._receiver.buffers.in_use == 0


def test_a_commit_that_fails_before_the_update_is_pending_leaves_its_buffer_with_its_push() -> None:
    failures: list[torch.Tensor] = []

    def before_update(params: torch.Tensor) -> None:
        failures.append(params)
        raise RuntimeError("the versions in flight could not be finished")

    config = ShardConfig(RuleSpec.parse("asgd", {"lr": "0.5"}), apply_during_reply=True)
    model = Model(config, Refusals(NullObserver()), SnapshotStore(1 << 20), before_update)
    model.adopt(LAYOUT)
    handed_over: list[bool] = []

    def hand_over() -> Callable[[], None]:
        handed_over.append(True)
        return lambda: None

    with pytest.raises(RuntimeError, match="could not be finished"):
        model.apply(1, torch.ones(LENGTH), PayloadKind.GRADIENT, 0, {}, hand_over)
    assert handed_over == [] and len(failures) == 1
    assert model.clock == 0 and torch.equal(model.params, torch.zeros(LENGTH))


@pytest.mark.parametrize(("rule", "during"), [("momentum", True), ("asgd", False)])
def test_the_model_takes_the_buffer_only_where_it_leaves_the_update_pending(rule: str, during: bool) -> None:
    config = ShardConfig(RuleSpec.parse(rule, {"lr": "0.5"}), apply_during_reply=during)
    model = Model(config, Refusals(NullObserver()), SnapshotStore(1 << 20), lambda params: None)
    model.adopt(LAYOUT)
    handed_over: list[bool] = []

    def hand_over() -> Callable[[], None]:
        handed_over.append(True)
        return lambda: None

    model.apply(1, torch.ones(LENGTH), PayloadKind.GRADIENT, 0, {}, hand_over)
    assert handed_over == [] and model.clock == 1
    assert model.live_params()[1] is None and torch.equal(model.params, torch.full((LENGTH,), -0.5))
