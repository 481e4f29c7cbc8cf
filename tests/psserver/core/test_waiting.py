"""A wait inside the shard whose client gave up: it ends within a slice, stops keeping its worker
alive, and leaves pushes exactly once (psserver.core.waiting)."""

from __future__ import annotations

import threading
import time

import torch

from psproto import codec
from psproto.layout import Layout
from psproto.v1 import ps_pb2
from psserver.core.consistency import Consistency, ConsistencyModel
from psserver.core.errors import ErrorKind, ShardError
from psserver.core.rules import RuleSpec
from psserver.core.shard import PushHeader, Shard, ShardConfig
from psserver.core.waiting import WAIT_SLICE_S
from psserver.core.workers import PushOutcome

LAYOUT = Layout.from_named_shapes([("w", (4,))])
FP32 = ps_pb2.DTYPE_FLOAT32
LEASE = 5.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_shard(model: ConsistencyModel, clock: FakeClock, rule: str = "asgd") -> Shard:
    options = {"lr": "1.0"} if rule == "asgd" else {}
    config = ShardConfig(RuleSpec.parse(rule, options), lease_seconds=LEASE, consistency=Consistency(model, 0))
    return Shard(config, clock)


def join(shard: Shard, name: str, resume: bool = False) -> int:
    return shard.join(name, "cpu", False, LAYOUT, LAYOUT.hash, resume=resume).worker.worker_id


def started(shard: Shard, *names: str) -> list[int]:
    """Workers joined, the shard initialised to zeros, and each worker's first pull done."""
    ids = [join(shard, name) for name in names]
    assembler = shard.begin_upload(ids[0], LAYOUT.hash)
    for chunk in codec.encode(torch.zeros(4)):
        shard.decode_chunk(assembler, chunk)
    shard.finish_upload(assembler)
    for worker_id in ids:
        shard.pull(worker_id, FP32)
    return ids


def push(
    shard: Shard, worker_id: int, push_id: int, values: list[float], gone: threading.Event | None = None
) -> PushOutcome:
    assert shard.rule is not None
    kind = int(min(shard.rule.accepted_kinds))  # GRADIENT for asgd, DELTA for gem
    abandoned = gone.is_set if gone is not None else None
    header = PushHeader(worker_id, push_id, 0, kind, LAYOUT.hash, {})
    return shard.push(header, codec.encode(torch.tensor(values)), abandoned=abandoned)


def in_thread(call: object, *args: object) -> tuple[threading.Thread, list[object]]:
    results: list[object] = []

    def run() -> None:
        try:
            results.append(call(*args))  # type: ignore[operator]
        except ShardError as error:
            results.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, results


def give_up(thread: threading.Thread, gone: threading.Event, results: list[object]) -> None:
    """The client gives up: the waiting call ends within a slice, refused as ABANDONED."""
    assert thread.is_alive()
    gone.set()
    began = time.monotonic()
    thread.join(WAIT_SLICE_S * 5)
    assert not thread.is_alive() and time.monotonic() - began < WAIT_SLICE_S * 5
    assert isinstance(results[0], ShardError) and results[0].kind is ErrorKind.ABANDONED and results[0].counted


def test_a_pull_held_by_ssp_ends_once_its_client_gave_up_and_its_worker_is_then_evictable() -> None:
    clock = FakeClock()
    shard = make_shard(ConsistencyModel.SSP, clock)
    ahead, behind = started(shard, "ahead", "behind")
    push(shard, ahead, 1, [1.0, 0.0, 0.0, 0.0])
    gone = threading.Event()
    thread, results = in_thread(lambda: shard.pull(ahead, FP32, abandoned=gone.is_set))
    thread.join(WAIT_SLICE_S * 1.5)
    # While its client is there the wait keeps its worker alive, past its lease.
    clock.now += LEASE + 1
    shard.heartbeat(behind, {})
    thread.join(WAIT_SLICE_S * 1.5)
    assert ahead in shard.workers and shard.evict_expired() == []
    give_up(thread, gone, results)
    assert shard.rejected == {"abandoned": 1}
    # Nothing refreshes it any more: it is evicted when its lease runs out, like any silent worker.
    clock.now += LEASE + 1
    shard.heartbeat(behind, {})
    assert [w.worker_id for w in shard.evict_expired()] == [ahead]


def test_a_bsp_push_abandoned_in_its_round_is_applied_once_and_its_retry_is_a_duplicate() -> None:
    clock = FakeClock()
    shard = make_shard(ConsistencyModel.BSP, clock)
    first, second = started(shard, "first", "second")
    gone = threading.Event()
    thread, results = in_thread(push, shard, first, 1, [2.0, 0.0, 0.0, 0.0], gone)
    thread.join(WAIT_SLICE_S * 1.5)
    give_up(thread, gone, results)
    assert shard.clock == 0
    push(shard, second, 1, [0.0, 2.0, 0.0, 0.0])  # completes the round the abandoned push is in
    assert shard.clock == 1 and shard.applied_pushes == 1
    torch.testing.assert_close(shard.params, torch.tensor([-1.0, -1.0, 0.0, 0.0]))
    retry = push(shard, first, 1, [2.0, 0.0, 0.0, 0.0])
    assert retry.duplicate and retry.clock == 1
    assert shard.clock == 1 and shard.applied_pushes == 1


def test_a_bsp_push_abandoned_by_a_worker_evicted_meanwhile_is_a_duplicate_after_it_rejoins() -> None:
    clock = FakeClock()
    shard = make_shard(ConsistencyModel.BSP, clock)
    first, second = started(shard, "first", "second")
    gone = threading.Event()
    thread, results = in_thread(push, shard, first, 1, [2.0, 0.0, 0.0, 0.0], gone)
    thread.join(WAIT_SLICE_S * 1.5)
    give_up(thread, gone, results)
    clock.now += LEASE + 1
    shard.heartbeat(second, {})
    assert [w.worker_id for w in shard.evict_expired()] == [first]
    push(shard, second, 1, [0.0, 2.0, 0.0, 0.0])
    assert shard.clock == 1
    torch.testing.assert_close(shard.params, torch.tensor([-1.0, -1.0, 0.0, 0.0]))
    again = join(shard, "first", resume=True)
    retry = push(shard, again, 1, [2.0, 0.0, 0.0, 0.0])
    assert retry.duplicate and shard.clock == 1 and shard.applied_pushes == 1


def test_a_gem_push_abandoned_before_its_turn_is_not_applied_and_its_retry_is() -> None:
    clock = FakeClock()
    shard = make_shard(ConsistencyModel.ASYNC, clock, rule="gem")
    holder, other = started(shard, "holder", "other")
    shard.pull(holder, FP32, exclusive=True)
    gone = threading.Event()
    thread, results = in_thread(push, shard, other, 1, [1.0, 0.0, 0.0, 0.0], gone)
    thread.join(WAIT_SLICE_S * 1.5)
    give_up(thread, gone, results)
    assert shard.clock == 0 and torch.equal(shard.params, torch.zeros(4))
    assert push(shard, holder, 1, [0.0, 1.0, 0.0, 0.0]).clock == 1
    retry = push(shard, other, 1, [1.0, 0.0, 0.0, 0.0])
    assert not retry.duplicate and retry.clock == 2 and shard.applied_pushes == 2


def test_a_reserved_pull_abandoned_while_another_holds_the_reservation_takes_nothing() -> None:
    clock = FakeClock()
    shard = make_shard(ConsistencyModel.ASYNC, clock, rule="gem")
    holder, other = started(shard, "holder", "other")
    shard.pull(holder, FP32, exclusive=True)
    gone = threading.Event()
    thread, results = in_thread(lambda: shard.pull(other, FP32, exclusive=True, abandoned=gone.is_set))
    thread.join(WAIT_SLICE_S * 1.5)
    give_up(thread, gone, results)
    # The holder's push is applied and nothing is reserved for the gone client: others go on.
    assert push(shard, holder, 1, [0.0, 1.0, 0.0, 0.0]).clock == 1
    assert push(shard, holder, 2, [0.0, 1.0, 0.0, 0.0]).clock == 2
