"""The shard core without a network: staleness, idempotent pushes, and every refusal."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator

import pytest
import torch

from psproto import codec
from psproto.layout import Layout
from psproto.v1 import ps_pb2
from psserver.core.errors import ErrorKind, ShardError
from psserver.core.pace import TransferPace
from psserver.core.rules import PayloadKind, RuleSpec
from psserver.core.serialized_pull import SerializedPull
from psserver.core.shard import PendingPush, PushHeader, Shard, ShardConfig
from psserver.core.workers import PushOutcome
from psserver.rpc.pull_encoding import PULL_RESPONSE, PUSH_PULL_PARAMS

LAYOUT = Layout.from_named_shapes([("w", (2, 3)), ("b", (2,))])
GRADIENT = int(PayloadKind.GRADIENT)


def make_shard(rule: str = "asgd", **options: str) -> Shard:
    return Shard(ShardConfig(RuleSpec.parse(rule, {"lr": "0.5", **options})))


def upload(shard: Shard, worker_id: int, values: torch.Tensor) -> bool:
    assembler = shard.begin_upload(worker_id, LAYOUT.hash)
    for chunk in codec.encode(values):
        shard.decode_chunk(assembler, chunk)
    applied, _ = shard.finish_upload(assembler)
    return applied


def push(
    shard: Shard,
    worker_id: int,
    push_id: int,
    base_clock: int,
    values: torch.Tensor,
    *,
    kind: int = GRADIENT,
    layout_hash: str = LAYOUT.hash,
    chunks: Iterable[ps_pb2.Chunk] | None = None,
) -> PushOutcome:
    return shard.push(
        PushHeader(worker_id, push_id, base_clock, kind, layout_hash, {}),
        chunks if chunks is not None else codec.encode(values, chunk_bytes=12),
    )


@pytest.fixture
def shard() -> Shard:
    shard = make_shard()
    first = shard.join("a", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    shard.join("b", "cpu", False, LAYOUT, LAYOUT.hash)
    upload(shard, first, torch.arange(8, dtype=torch.float32))
    return shard


def test_first_init_wins(shard: Shard) -> None:
    assert not upload(shard, 2, torch.zeros(8))
    assert torch.equal(shard.params, torch.arange(8, dtype=torch.float32))


def test_asgd_applies_and_counts_staleness(shard: Shard) -> None:
    ones = torch.ones(8)
    first = push(shard, 1, 1, 0, ones)
    second = push(shard, 2, 1, 0, ones)  # computed on clock 0, applied at clock 1
    assert (first.clock, first.staleness) == (1, 0)
    assert (second.clock, second.staleness) == (2, 1)
    torch.testing.assert_close(shard.params, torch.arange(8, dtype=torch.float32) - 1.0)
    assert shard.workers[2].max_staleness == 1


def test_pull_returns_the_clock_and_the_parameters(shard: Shard) -> None:
    push(shard, 1, 1, 0, torch.ones(8))
    result = shard.pull(2, ps_pb2.DTYPE_FLOAT32)
    out = torch.empty(8)
    assembler = codec.Assembler(out)
    for chunk in result.chunks:
        assembler.add(chunk)
    assembler.finish()
    assert result.clock == 1
    torch.testing.assert_close(out, torch.arange(8, dtype=torch.float32) - 0.5)
    assert shard.workers[2].pulled_clock == 1


def test_a_retried_push_is_acknowledged_not_applied(shard: Shard) -> None:
    first = push(shard, 1, 7, 0, torch.ones(8))
    params = shard.params.clone()
    again = push(shard, 1, 7, 0, torch.ones(8))
    assert again.duplicate
    assert (again.clock, again.staleness) == (first.clock, first.staleness)
    assert shard.clock == 1
    assert torch.equal(shard.params, params)
    assert shard.workers[1].duplicate_pushes == 1


def _bad_chunk(offset: int, count: int, dtype: int = ps_pb2.DTYPE_FLOAT32) -> ps_pb2.Chunk:
    chunk = ps_pb2.Chunk(offset=offset)
    chunk.dtype = dtype  # type: ignore[assignment]
    chunk.data = torch.ones(count).numpy().tobytes()
    return chunk


REFUSALS = {
    "unknown worker": (ErrorKind.UNKNOWN_WORKER, {"worker_id": 99}),
    "layout hash": (ErrorKind.LAYOUT_MISMATCH, {"layout_hash": "0" * 64}),
    "too short": (ErrorKind.WRONG_LENGTH, {"chunks": [_bad_chunk(0, 7)]}),
    "too long": (ErrorKind.CHUNK_OUT_OF_RANGE, {"chunks": [_bad_chunk(0, 9)]}),
    "past the end": (ErrorKind.CHUNK_OUT_OF_RANGE, {"chunks": [_bad_chunk(0, 4), _bad_chunk(6, 4)]}),
    "unknown dtype": (ErrorKind.UNKNOWN_DTYPE, {"chunks": [_bad_chunk(0, 8, dtype=42)]}),
    "nan": (ErrorKind.NON_FINITE, {"values": torch.tensor([0, 0, float("nan"), 0, 0, 0, 0, 0.0])}),
    "inf": (ErrorKind.NON_FINITE, {"values": torch.tensor([0, 0, 0, 0, 0, 0, 0, float("inf")])}),
    "future clock": (ErrorKind.FUTURE_CLOCK, {"base_clock": 5}),
    "unknown kind": (ErrorKind.BAD_REQUEST, {"kind": 7}),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_every_refusal_changes_nothing(shard: Shard, case: str) -> None:
    kind, overrides = REFUSALS[case]
    before = (shard.params.clone(), shard.clock, shard.workers[1].pushes)
    arguments: dict[str, object] = {"worker_id": 1, "push_id": 1, "base_clock": 0, "values": torch.ones(8)}
    arguments.update(overrides)
    with pytest.raises(ShardError) as caught:
        push(shard, **arguments)  # type: ignore[arg-type]
    assert caught.value.kind is kind
    assert caught.value.message
    assert torch.equal(shard.params, before[0])
    assert (shard.clock, shard.workers[1].pushes) == before[1:]
    assert shard.rejected[kind.reason] == 1


def test_momentum_refuses_a_delta(shard: Shard) -> None:
    momentum = make_shard("momentum")
    worker = momentum.join("a", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    upload(momentum, worker, torch.zeros(8))
    with pytest.raises(ShardError, match="does not take DELTA") as caught:
        push(momentum, worker, 1, 0, torch.ones(8), kind=int(PayloadKind.DELTA))
    assert caught.value.kind is ErrorKind.BAD_REQUEST


def test_join_with_another_layout_is_refused(shard: Shard) -> None:
    other = Layout.from_named_shapes([("w", (3, 3))])
    with pytest.raises(ShardError) as caught:
        shard.join("c", "cpu", False, other, other.hash)
    assert caught.value.kind is ErrorKind.LAYOUT_MISMATCH
    assert len(shard.workers) == 2


def test_join_with_a_hash_that_does_not_match_its_layout_is_refused() -> None:
    shard = make_shard()
    with pytest.raises(ShardError) as caught:
        shard.join("a", "cpu", False, LAYOUT, "f" * 64)
    assert caught.value.kind is ErrorKind.LAYOUT_MISMATCH
    assert shard.layout is None


def test_join_with_another_shard_count_is_refused() -> None:
    shard = make_shard()
    two = Layout.from_named_shapes(LAYOUT.specs, 2)
    with pytest.raises(ShardError, match="same shard count"):
        shard.join("a", "cpu", False, two, two.hash)


def test_init_with_another_layout_after_init_is_already_exists(shard: Shard) -> None:
    with pytest.raises(ShardError) as caught:
        shard.begin_upload(1, "a" * 64)
    assert caught.value.kind is ErrorKind.INIT_CONFLICT
    assert torch.equal(shard.params, torch.arange(8, dtype=torch.float32))


def test_init_with_nan_is_refused_and_leaves_the_shard_uninitialised() -> None:
    shard = make_shard()
    worker = shard.join("a", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    with pytest.raises(ShardError) as caught:
        upload(shard, worker, torch.tensor([float("nan")] * 8))
    assert caught.value.kind is ErrorKind.NON_FINITE
    assert not shard.initialized


def test_push_and_pull_before_init_are_refused() -> None:
    shard = make_shard()
    worker = shard.join("a", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    with pytest.raises(ShardError) as caught:
        push(shard, worker, 1, 0, torch.ones(8))
    assert caught.value.kind is ErrorKind.NOT_INITIALIZED
    with pytest.raises(ShardError):
        shard.pull(worker, ps_pb2.DTYPE_FLOAT32)


def test_observers_pull_but_never_push(shard: Shard) -> None:
    observer = shard.join("eval", "cpu", True, LAYOUT, LAYOUT.hash).worker.worker_id
    assert shard.pull(observer, ps_pb2.DTYPE_FLOAT32).clock == 0
    with pytest.raises(ShardError, match="observers cannot push"):
        push(shard, observer, 1, 0, torch.ones(8))


def test_leave_forgets_the_worker(shard: Shard) -> None:
    shard.leave(2)
    with pytest.raises(ShardError) as caught:
        push(shard, 2, 1, 0, torch.ones(8))
    assert caught.value.kind is ErrorKind.UNKNOWN_WORKER


def test_pull_cache_is_shared_per_clock(shard: Shard) -> None:
    first = shard.pull(1, ps_pb2.DTYPE_FLOAT32)
    second = shard.pull(2, ps_pb2.DTYPE_FLOAT32)
    assert first.chunks is second.chunks
    push(shard, 1, 1, 0, torch.ones(8))
    third = shard.pull(2, ps_pb2.DTYPE_FLOAT32)
    assert third.chunks is not first.chunks
    assert third.clock == 1


@pytest.mark.parametrize("rule", ["asgd", "gap-aware"])
@pytest.mark.parametrize("dtype", [ps_pb2.DTYPE_FLOAT32, ps_pb2.DTYPE_BFLOAT16])
def test_serialised_pulls_parse_to_the_parameters_and_are_shared_per_clock(rule: str, dtype: int) -> None:
    shard = make_shard(rule)
    first = shard.join("a", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    second = shard.join("b", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    upload(shard, first, torch.arange(8, dtype=torch.float32))
    push(shard, first, 1, 0, torch.ones(8))
    expected = torch.arange(8, dtype=torch.float32) - 0.5
    for encoder, message_type in (
        (PULL_RESPONSE, ps_pb2.PullResponse),
        (PUSH_PULL_PARAMS, ps_pb2.PushPullResponse),
    ):
        result = shard.pull(first, dtype, encoder=encoder)
        assert shard.pull(second, dtype, encoder=encoder).messages is result.messages
        out = torch.empty(8)
        assembler = codec.Assembler(out)
        for data in result.messages:
            message = message_type.FromString(data)
            response = message if isinstance(message, ps_pb2.PullResponse) else message.params
            assert (response.clock, response.total_length) == (1, 8)
            assembler.add(response.chunk)
        assembler.finish()
        torch.testing.assert_close(out, expected.to(codec.wire_dtype(dtype)).float())
        assert result.data_bytes == 8 * (4 if dtype == ps_pb2.DTYPE_FLOAT32 else 2)
    push(shard, second, 1, 1, torch.ones(8))
    assert shard.pull(first, dtype, encoder=PULL_RESPONSE).messages is not result.messages


def _decode_pull(messages: Iterable[bytes], length: int) -> torch.Tensor:
    out = torch.empty(length)
    assembler = codec.Assembler(out)
    for data in messages:
        assembler.add(ps_pb2.PushPullResponse.FromString(data).params.chunk)
    assembler.finish()
    return out


@pytest.mark.parametrize("dtype", [ps_pb2.DTYPE_FLOAT32, ps_pb2.DTYPE_BFLOAT16])
def test_a_version_being_sent_stays_that_version_when_a_push_changes_the_parameters(dtype: int) -> None:
    # 8 bytes per chunk: 2 fp32 or 4 bf16 elements, so the version is several messages long.
    shard = Shard(ShardConfig(RuleSpec.parse("asgd", {"lr": "0.5"}), chunk_bytes=8))
    first = shard.join("a", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    second = shard.join("b", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    upload(shard, first, torch.arange(8, dtype=torch.float32))
    before = torch.arange(8, dtype=torch.float32).to(codec.wire_dtype(dtype)).float()

    result = shard.pull(first, dtype, encoder=PUSH_PULL_PARAMS)
    messages = iter(result.messages)
    sent = [next(messages)]  # the transport has sent the first message only
    push(shard, second, 1, 0, torch.ones(8))
    sent += list(messages)

    assert len(sent) == len(result.messages) > 1
    torch.testing.assert_close(_decode_pull(sent, 8), before)
    after = shard.pull(first, dtype, encoder=PUSH_PULL_PARAMS)
    assert after.clock == result.clock + 1
    expected_after = (torch.arange(8) - 0.5).to(codec.wire_dtype(dtype)).float()
    torch.testing.assert_close(_decode_pull(after.messages, 8), expected_after)


def test_a_version_no_reply_holds_any_more_is_not_built_at_the_next_push() -> None:
    shard = Shard(ShardConfig(RuleSpec.parse("asgd", {"lr": "0.5"}), chunk_bytes=8))
    first = shard.join("a", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    second = shard.join("b", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    upload(shard, first, torch.arange(8, dtype=torch.float32))
    being_sent = shard.pull(first, ps_pb2.DTYPE_FLOAT32, encoder=PUSH_PULL_PARAMS)
    abandoned = shard.pull(second, ps_pb2.DTYPE_FLOAT32, encoder=PULL_RESPONSE).messages
    # The stream of ``abandoned`` was cancelled: only its message sequence is left, no reply.
    assert isinstance(abandoned, SerializedPull) and isinstance(being_sent.messages, SerializedPull)

    push(shard, second, 1, 0, torch.ones(8))

    assert being_sent.messages.frozen_bytes == 8 * 4
    assert abandoned.frozen_bytes == 0


def test_old_push_ids_beyond_the_remembered_window_are_still_duplicates() -> None:
    from psserver.core import workers

    record = workers.WorkerRecord(1, "a", "cpu", False)
    for push_id in range(1, workers.RECENT_PUSHES_KEPT + 10):
        record.record_push(push_id, PushOutcome(push_id, 0, {}))
    assert record.previous_outcome(1) is not None
    assert record.previous_outcome(workers.RECENT_PUSHES_KEPT + 10) is None


def test_at_the_version_limit_a_pull_gets_the_newest_version_being_sent() -> None:
    shard = Shard(ShardConfig(RuleSpec.parse("asgd", {"lr": "0.5"}), pull_versions=1))
    first = shard.join("a", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    second = shard.join("b", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    upload(shard, first, torch.zeros(8))
    being_sent = shard.pull(first, ps_pb2.DTYPE_FLOAT32, encoder=PUSH_PULL_PARAMS)
    push(shard, second, 1, 0, torch.ones(8))
    coalesced = shard.pull(second, ps_pb2.DTYPE_FLOAT32, encoder=PUSH_PULL_PARAMS)
    assert coalesced is being_sent and coalesced.clock == 0
    assert shard.workers[second].pulled_clock == 0
    assert push(shard, second, 2, coalesced.clock, torch.ones(8)).staleness == 1
    del being_sent, coalesced  # sent: no version is in flight any more
    fresh = shard.pull(second, ps_pb2.DTYPE_FLOAT32, encoder=PUSH_PULL_PARAMS)
    assert fresh.clock == 2 and shard.workers[second].pulled_clock == 2
    # In-process pulls always see the latest clock.
    assert shard.pull(first, ps_pb2.DTYPE_FLOAT32).clock == 2


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_push_holding_its_buffer_without_sending_is_cancelled_once_idle_too_long() -> None:
    clock = FakeClock()
    # A pace this slow never ends the push: only its idleness does.
    config = ShardConfig(
        RuleSpec.parse("asgd", {"lr": "0.5"}), receive_idle_seconds=5.0, transfer_pace=TransferPace(1.0)
    )
    shard = Shard(config, clock_source=clock)
    worker = shard.join("a", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    upload(shard, worker, torch.zeros(8))
    cancelled: list[int] = []
    ended: list[PendingPush] = []
    chunks = list(codec.encode(torch.ones(8), chunk_bytes=12))

    def stream() -> Iterator[codec.ChunkLike]:
        yield chunks[0]
        clock.now += 4.0
        yield chunks[1]  # each chunk restarts the idle time
        clock.now += 4.0
        assert shard.cancel_stalled_pushes() == [] and cancelled == []
        clock.now += 2.0
        ended.extend(shard.cancel_stalled_pushes())
        assert len(ended) == 1 and cancelled == [1]
        assert shard.rejected == {"push_stalled": 1}
        assert shard.cancel_stalled_pushes() == []  # cancelled once
        raise ConnectionError("cancelled")  # what the transport's stream raises once cancelled

    with pytest.raises(ShardError, match="sent nothing for 5 s") as refused:
        shard.push(PushHeader(worker, 1, 0, GRADIENT, LAYOUT.hash, {}), stream(), cancel=lambda: cancelled.append(1))
    assert refused.value.kind is ErrorKind.PUSH_STALLED and refused.value.counted
    assert ended[0].buffers.in_use == 0 and shard.clock == 0


def test_a_stream_that_breaks_mid_push_applies_nothing_and_gives_its_buffer_back() -> None:
    shard = make_shard()
    worker = shard.join("a", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    upload(shard, worker, torch.zeros(8))

    def stream() -> Iterator[codec.ChunkLike]:
        yield next(codec.encode(torch.ones(8), chunk_bytes=12))
        raise ConnectionError("the client went away")

    with pytest.raises(ConnectionError, match="went away"):  # no limit ended it: the transport's own error
        shard.push(PushHeader(worker, 1, 0, GRADIENT, LAYOUT.hash, {}), stream())
    assert shard.clock == 0 and shard._receiver.buffers.in_use == 0
    assert not push(shard, worker, 1, 0, torch.ones(8)).duplicate  # its retry is applied, once


def test_a_push_whose_stream_ended_is_not_cancelled_while_it_waits_to_be_applied() -> None:
    clock = FakeClock()
    config = ShardConfig(RuleSpec.parse("gem", {}), receive_idle_seconds=5.0, exclusive_pull_seconds=10.0)
    shard = Shard(config, clock_source=clock)
    holder = shard.join("holder", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    other = shard.join("other", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    upload(shard, holder, torch.zeros(8))
    shard.pull(other, ps_pb2.DTYPE_FLOAT32)
    shard.pull(holder, ps_pb2.DTYPE_FLOAT32, exclusive=True)
    delta = int(PayloadKind.DELTA)
    results: list[PushOutcome] = []
    header = PushHeader(other, 1, 0, delta, LAYOUT.hash, {})

    def other_push() -> None:
        results.append(shard.push(header, codec.encode(torch.ones(8)), cancel=lambda: pytest.fail("cancelled")))

    waiting = threading.Thread(target=other_push, daemon=True)
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive()  # its buffer held, waiting for the holder's push
    clock.now += 6.0  # past the idle limit, not past the reservation
    assert shard.cancel_stalled_pushes() == []
    shard.push(PushHeader(holder, 1, 0, delta, LAYOUT.hash, {}), codec.encode(torch.zeros(8)))
    waiting.join(5)
    assert results and results[0].clock == 2


def test_a_push_cancelled_as_its_stream_ends_is_never_applied() -> None:
    """The reaper may cancel a push whose last message has arrived but whose end has not."""
    clock = FakeClock()
    shard = Shard(ShardConfig(RuleSpec.parse("asgd", {"lr": "0.5"}), receive_idle_seconds=5.0), clock_source=clock)
    worker = shard.join("a", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    upload(shard, worker, torch.zeros(8))
    ended: list[PendingPush] = []

    def stream() -> Iterator[codec.ChunkLike]:
        yield from codec.encode(torch.ones(8))
        clock.now += 6.0
        ended.extend(shard.cancel_stalled_pushes())
        assert len(ended) == 1
        # ...and then the stream ends cleanly

    with pytest.raises(ShardError, match="sent nothing for 5 s") as refused:
        shard.push(PushHeader(worker, 1, 0, GRADIENT, LAYOUT.hash, {}), stream(), cancel=lambda: None)
    assert refused.value.kind is ErrorKind.PUSH_STALLED and refused.value.counted
    assert shard.clock == 0 and torch.equal(shard.params, torch.zeros(8))
    assert shard.rejected == {"push_stalled": 1}
    assert ended[0].buffers.in_use == 0
    assert not push(shard, worker, 1, 0, torch.ones(8)).duplicate  # the retry is applied, once


def test_a_push_asking_for_an_unknown_pull_dtype_is_refused_at_its_header(shard: Shard) -> None:
    with pytest.raises(ShardError, match="unknown chunk dtype 9") as refused:
        shard.push(PushHeader(1, 1, 0, GRADIENT, LAYOUT.hash, {}, pull_dtype=9), codec.encode(torch.ones(8)))
    assert refused.value.kind is ErrorKind.UNKNOWN_DTYPE and shard.clock == 0


def test_a_join_under_a_joined_workers_name_is_refused_unless_it_resumes(shard: Shard) -> None:
    push(shard, 1, 7, 0, torch.ones(8))
    with pytest.raises(ShardError, match="worker name 'a' is in use by joined worker 1") as refused:
        shard.join("a", "cpu", False, LAYOUT, LAYOUT.hash)
    assert refused.value.kind is ErrorKind.NAME_IN_USE
    assert sorted(shard.workers) == [1, 2]
    again = shard.join("a", "cpu", False, LAYOUT, LAYOUT.hash, resume=True).worker.worker_id
    assert sorted(shard.workers) == [2, again]
    assert push(shard, again, 7, 0, torch.ones(8)).duplicate  # its push ids came along
