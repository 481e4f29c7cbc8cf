"""Receive buffers: reused, bounded, and never held by pushes that wait on other pushes."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from psproto import codec
from psproto.layout import Layout
from psproto.v1 import ps_pb2
from psserver.core.buffers import MAX_POOL_BYTES, BufferWaitTimeoutError, ReceiveBuffers
from psserver.core.consistency import Consistency, ConsistencyModel
from psserver.core.errors import ErrorKind, ShardError
from psserver.core.rules import PayloadKind, RuleSpec
from psserver.core.shard import PushHeader, Shard, ShardConfig

LAYOUT = Layout.from_named_shapes([("w", (4, 4))])
WAIT_S = 10.0


def test_a_released_buffer_is_reused() -> None:
    pool = ReceiveBuffers(16, limit=2)
    first = pool.acquire(0)
    pool.release(first)
    assert pool.acquire(0) is first
    assert pool.allocated == 1


def test_past_one_buffer_the_pool_holds_at_most_max_pool_bytes() -> None:
    # Nothing is allocated before ``acquire``: the limits alone are read.
    assert ReceiveBuffers(16, limit=2).limit == 2
    assert ReceiveBuffers(MAX_POOL_BYTES // 8, limit=3).limit == 2
    assert ReceiveBuffers(MAX_POOL_BYTES // 4, limit=2).limit == 1
    assert ReceiveBuffers(MAX_POOL_BYTES, limit=2).limit == 1  # one buffer always, however large


def test_acquire_waits_while_the_limit_is_in_use() -> None:
    pool = ReceiveBuffers(16, limit=1)
    held = pool.acquire(0)
    with pytest.raises(TimeoutError):
        pool.acquire(0.05)
    got: list[torch.Tensor] = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire(WAIT_S)))
    waiter.start()
    pool.release(held)
    waiter.join(WAIT_S)
    assert got == [held]


def test_bypass_gives_a_temporary_buffer_that_is_not_kept() -> None:
    pool = ReceiveBuffers(16, limit=1)
    held = pool.acquire(0)
    extra = pool.acquire(0, bypass_limit=True)
    assert extra is not held and pool.in_use == 2
    pool.release(extra)
    pool.release(held)
    assert pool.in_use == 0 and pool.allocated == 1


def test_an_owner_holds_one_buffer_at_a_time_even_when_bypassing_the_limit() -> None:
    pool = ReceiveBuffers(16, limit=3)
    mine = pool.acquire(0, owner="a")
    for bypass in (False, True):
        with pytest.raises(BufferWaitTimeoutError) as waited:
            pool.acquire(0.01, owner="a", bypass_limit=bypass)
        assert waited.value.own_share and "worker a already holds one" in str(waited.value)
    theirs = pool.acquire(0, owner="b")
    assert pool.held_by("a") == pool.held_by("b") == 1
    got: list[torch.Tensor] = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire(WAIT_S, owner="a")))
    waiter.start()
    pool.release(theirs, "b")  # frees the pool, not a's share: a still waits
    waiter.join(0.1)
    assert waiter.is_alive()
    pool.release(mine, "a")
    waiter.join(WAIT_S)
    assert len(got) == 1 and pool.held_by("a") == 1


def test_a_buffer_of_another_length_is_refused() -> None:
    with pytest.raises(ValueError, match="16"):
        ReceiveBuffers(16, limit=1).release(torch.empty(8))
    with pytest.raises(ValueError, match="at least one"):
        ReceiveBuffers(16, limit=0)


def _shard(receive_buffers: int, consistency: Consistency | None = None, wait_s: float = WAIT_S) -> Shard:
    config = ShardConfig(
        RuleSpec.parse("asgd", {"lr": "1"}),
        consistency=consistency or Consistency(),
        receive_buffers=receive_buffers,
        receive_wait_seconds=wait_s,
    )
    shard = Shard(config)
    return shard


def _join(shard: Shard, count: int) -> list[int]:
    ids = [shard.join(f"w{i}", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id for i in range(count)]
    assembler = shard.begin_upload(ids[0], LAYOUT.hash)
    for chunk in codec.encode(torch.zeros(16)):
        shard.decode_chunk(assembler, chunk)
    shard.finish_upload(assembler)
    return ids


def _push(shard: Shard, worker_id: int, push_id: int, value: float) -> None:
    header = PushHeader(worker_id, push_id, shard.clock, int(PayloadKind.GRADIENT), LAYOUT.hash, {})
    shard.push(header, codec.encode(torch.full((16,), value)))


def test_a_bsp_round_larger_than_the_buffer_pool_completes() -> None:
    shard = _shard(receive_buffers=1, consistency=Consistency(ConsistencyModel.BSP))
    workers = _join(shard, 4)
    errors: list[BaseException] = []

    def run(worker_id: int) -> None:
        try:
            _push(shard, worker_id, 1, float(worker_id))
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(w,)) for w in workers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    assert not errors and not any(t.is_alive() for t in threads)
    assert shard.clock == 1
    torch.testing.assert_close(shard.params, torch.full((16,), -sum(workers) / 4))


def test_a_refused_push_gives_its_buffer_back() -> None:
    shard = _shard(receive_buffers=1, wait_s=0.1)
    (worker,) = _join(shard, 1)
    nan = ps_pb2.Chunk(offset=0, dtype=ps_pb2.DTYPE_FLOAT32, data=b"\0\0\xc0\x7f" * 16)
    with pytest.raises(ShardError) as caught:
        shard.push(PushHeader(worker, 1, 0, int(PayloadKind.GRADIENT), LAYOUT.hash, {}), [nan])
    assert caught.value.kind is ErrorKind.NON_FINITE
    _push(shard, worker, 2, 1.0)  # would wait out receive_wait_seconds if the buffer were still held
    assert shard.clock == 1


def test_a_push_that_finds_no_free_buffer_in_time_is_refused() -> None:
    shard = _shard(receive_buffers=1, wait_s=0.05)
    first, second = _join(shard, 2)
    holds, release = threading.Event(), threading.Event()

    def holding_stream() -> Iterator[codec.ChunkLike]:
        yield from codec.encode(torch.ones(16))
        holds.set()  # its only chunk is in the pool's one buffer
        release.wait(WAIT_S)

    header = PushHeader(first, 1, 0, int(PayloadKind.GRADIENT), LAYOUT.hash, {})
    holding = threading.Thread(target=shard.push, args=(header, holding_stream()))
    holding.start()
    assert holds.wait(WAIT_S)
    with pytest.raises(ShardError) as caught:
        shard.push(PushHeader(second, 1, 0, int(PayloadKind.GRADIENT), LAYOUT.hash, {}), codec.encode(torch.ones(16)))
    assert caught.value.kind is ErrorKind.LIMIT_REACHED and "shard.receive_buffers" in caught.value.message
    release.set()
    holding.join(WAIT_S)
    torch.testing.assert_close(shard.params, torch.full((16,), -1.0))
