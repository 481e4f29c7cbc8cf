"""SSP, BSP, leases and GEM's reservation, driven through the shard core with threads."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from psproto import codec
from psproto.layout import Layout
from psproto.v1 import ps_pb2
from psserver.core.consistency import Consistency, ConsistencyModel, bsp_round_complete, ssp_must_wait
from psserver.core.errors import ErrorKind, ShardError
from psserver.core.rules import PayloadKind, RuleSpec
from psserver.core.shard import PushHeader, Shard, ShardConfig
from psserver.core.workers import PushOutcome

LAYOUT = Layout.from_named_shapes([("w", (4,))])
FP32 = ps_pb2.DTYPE_FLOAT32


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_shard(
    model: ConsistencyModel, bound: int = 3, lease: float = 30.0, clock: FakeClock | None = None, rule: str = "asgd"
) -> Shard:
    options = {"lr": "1.0"} if rule == "asgd" else {}
    config = ShardConfig(RuleSpec.parse(rule, options), lease_seconds=lease, consistency=Consistency(model, bound))
    return Shard(config, clock or time.monotonic)


def join(shard: Shard, name: str) -> int:
    return shard.join(name, "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id


def init(shard: Shard, worker_id: int) -> None:
    assembler = shard.begin_upload(worker_id, LAYOUT.hash)
    for chunk in codec.encode(torch.zeros(4)):
        shard.decode_chunk(assembler, chunk)
    shard.finish_upload(assembler)


def push(shard: Shard, worker_id: int, push_id: int, values: list[float]) -> PushOutcome:
    base = shard.workers[worker_id].pulled_clock
    assert shard.rule is not None
    kind = min(shard.rule.accepted_kinds)  # GRADIENT for asgd, DELTA for gem
    return shard.push(
        PushHeader(worker_id, push_id, max(base, 0), int(kind), LAYOUT.hash, {}), codec.encode(torch.tensor(values))
    )


def in_thread(target: object, *args: object) -> tuple[threading.Thread, list[object]]:
    results: list[object] = []

    def run() -> None:
        try:
            results.append(target(*args))  # type: ignore[operator]
        except ShardError as error:
            results.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, results


def test_pure_decisions() -> None:
    assert not ssp_must_wait(3, [3, 3], 0)
    assert ssp_must_wait(4, [3, 4], 0)
    assert not ssp_must_wait(5, [2, 5], 3)
    assert ssp_must_wait(6, [2, 6], 3)
    assert bsp_round_complete({1, 2}, [1, 2])
    assert not bsp_round_complete({1}, [1, 2])
    assert not bsp_round_complete(set(), [])
    with pytest.raises(ValueError, match="SSP bound"):
        Consistency(ConsistencyModel.SSP, -1)


def test_ssp_zero_is_lock_step() -> None:
    shard = make_shard(ConsistencyModel.SSP, bound=0)
    fast, slow = join(shard, "fast"), join(shard, "slow")
    init(shard, fast)
    shard.pull(fast, FP32)
    shard.pull(slow, FP32)
    push(shard, fast, 1, [1, 1, 1, 1])
    # The fast worker is one push ahead: its next pull must wait for the slow one.
    thread, results = in_thread(shard.pull, fast, FP32)
    thread.join(0.5)
    assert thread.is_alive() and not results
    push(shard, slow, 1, [1, 1, 1, 1])
    thread.join(5)
    assert not thread.is_alive() and results[0].clock == 2  # type: ignore[attr-defined]
    clocks = [w.ssp_clock for w in shard.workers.values()]
    assert max(clocks) - min(clocks) == 0


def test_ssp_bound_lets_a_worker_run_s_pushes_ahead() -> None:
    shard = make_shard(ConsistencyModel.SSP, bound=2)
    fast, _ = join(shard, "fast"), join(shard, "slow")
    init(shard, fast)
    for push_id in (1, 2):
        shard.pull(fast, FP32)
        push(shard, fast, push_id, [0, 0, 0, 1])
    shard.pull(fast, FP32)  # 2 ahead: allowed
    push(shard, fast, 3, [0, 0, 0, 1])
    thread, results = in_thread(shard.pull, fast, FP32)  # 3 ahead: waits
    thread.join(0.5)
    assert thread.is_alive()
    shard.leave(2)  # the slow worker leaves the minimum
    thread.join(5)
    assert results and results[0].clock == 3  # type: ignore[attr-defined]


def test_bsp_applies_the_mean_once_per_round() -> None:
    shard = make_shard(ConsistencyModel.BSP)
    a, b = join(shard, "a"), join(shard, "b")
    init(shard, a)
    shard.pull(a, FP32)
    shard.pull(b, FP32)
    thread, results = in_thread(push, shard, a, 1, [2.0, 0.0, 4.0, 0.0])
    thread.join(0.5)
    assert thread.is_alive() and shard.clock == 0
    second = push(shard, b, 1, [0.0, 2.0, 0.0, 0.0])
    thread.join(5)
    first = results[0]
    assert isinstance(first, PushOutcome)
    assert first.clock == second.clock == 1 and first.staleness == second.staleness == 0
    torch.testing.assert_close(shard.params, torch.tensor([-1.0, -1.0, -2.0, 0.0]))
    assert shard.applied_pushes == 1


def test_a_silent_worker_is_evicted_and_releases_the_bsp_barrier() -> None:
    clock = FakeClock()
    shard = make_shard(ConsistencyModel.BSP, lease=5.0, clock=clock)
    a, b = join(shard, "a"), join(shard, "dead")
    init(shard, a)
    shard.pull(a, FP32)
    thread, results = in_thread(push, shard, a, 1, [1.0, 1.0, 1.0, 1.0])
    thread.join(0.3)
    assert thread.is_alive()
    clock.now += 6.0  # "dead" never speaks again; the waiter keeps itself alive
    thread.join(5)
    assert not thread.is_alive()
    assert isinstance(results[0], PushOutcome) and results[0].clock == 1
    assert b not in shard.workers and a in shard.workers
    assert shard.evictions == 1
    torch.testing.assert_close(shard.params, torch.full((4,), -1.0))


def test_evict_expired_frees_only_silent_workers() -> None:
    clock = FakeClock()
    shard = make_shard(ConsistencyModel.ASYNC, lease=5.0, clock=clock)
    a, b = join(shard, "a"), join(shard, "b")
    clock.now += 3.0
    shard.heartbeat(a, {"samples_per_second": 10.0})
    clock.now += 3.0
    evicted = shard.evict_expired()
    assert [w.worker_id for w in evicted] == [b]
    assert list(shard.workers) == [a]


def test_a_reservation_holds_other_pushes_until_its_holder_pushes() -> None:
    shard = make_shard(ConsistencyModel.ASYNC, rule="gem")
    holder, other = join(shard, "gem"), join(shard, "other")
    init(shard, holder)
    shard.pull(other, FP32)
    shard.pull(holder, FP32, exclusive=True)
    thread, results = in_thread(push, shard, other, 1, [1.0, 0.0, 0.0, 0.0])
    thread.join(0.5)
    assert thread.is_alive() and shard.clock == 0
    mine = push(shard, holder, 1, [0.0, 1.0, 0.0, 0.0])
    thread.join(5)
    assert mine.clock == 1 and mine.staleness == 0
    assert isinstance(results[0], PushOutcome) and results[0].clock == 2 and results[0].staleness == 1


def _reserved_gem_shard() -> tuple[FakeClock, Shard, int, int]:
    """A GEM shard on a fake clock whose worker ``holder`` reserved it; ``other`` pulled too."""
    clock = FakeClock()
    shard = make_shard(ConsistencyModel.ASYNC, clock=clock, rule="gem")
    holder, other = join(shard, "gem"), join(shard, "other")
    init(shard, holder)
    shard.pull(other, FP32)
    shard.pull(holder, FP32, exclusive=True)
    return clock, shard, holder, other


def test_a_reservation_lapses() -> None:
    clock, shard, _, other = _reserved_gem_shard()
    clock.now += shard.config.exclusive_pull_seconds + 1
    assert push(shard, other, 1, [1.0, 0.0, 0.0, 0.0]).clock == 1


def test_pulling_again_does_not_extend_a_reservation() -> None:
    clock, shard, holder, other = _reserved_gem_shard()
    clock.now += shard.config.exclusive_pull_seconds / 2
    shard.pull(holder, FP32, exclusive=True)  # would hold the shard forever if it renewed the deadline
    clock.now += shard.config.exclusive_pull_seconds / 2 + 1
    thread, results = in_thread(push, shard, other, 1, [1.0, 0.0, 0.0, 0.0])
    thread.join(5)
    assert not thread.is_alive(), "the reservation was extended by pulling again"
    assert isinstance(results[0], PushOutcome) and results[0].clock == 1


@pytest.mark.parametrize(
    ("rule", "observer", "message"),
    [
        ("asgd", False, "rule asgd with these options takes no exclusive pulls"),
        ("gem", True, "observers cannot take an exclusive pull"),
    ],
)
def test_reserved_pulls_are_refused_where_nothing_waits_for_them(rule: str, observer: bool, message: str) -> None:
    shard = make_shard(ConsistencyModel.ASYNC, rule=rule)
    writer = join(shard, "writer")
    init(shard, writer)
    reader = shard.join("reader", "cpu", observer, LAYOUT, LAYOUT.hash).worker.worker_id
    with pytest.raises(ShardError, match=message) as refused:
        shard.pull(reader, FP32, exclusive=True)
    assert refused.value.kind is ErrorKind.BAD_REQUEST
    assert shard.rejected == {"bad_request": 1}
    # Nobody holds the shard: a push goes straight through.
    assert push(shard, writer, 1, [1.0, 0.0, 0.0, 0.0]).clock == 1


def test_gem_without_atomic_takes_no_reserved_pulls() -> None:
    config = ShardConfig(RuleSpec.parse("gem", {"atomic": "false"}))
    shard = Shard(config)
    worker = join(shard, "w")
    init(shard, worker)
    with pytest.raises(ShardError, match="rule gem with these options takes no exclusive pulls"):
        shard.pull(worker, FP32, exclusive=True)


def test_bsp_reports_the_round_once_and_every_contributor() -> None:
    from psserver.core.observer import NullObserver

    class Recorder(NullObserver):
        def __init__(self) -> None:
            self.updates: list[int] = []
            self.pushes: list[str] = []

        def update_applied(self, apply_seconds: float, clock: int) -> None:
            self.updates.append(clock)

        def push_applied(self, worker: object, outcome: PushOutcome) -> None:
            self.pushes.append(worker.name)  # type: ignore[attr-defined]

    recorder = Recorder()
    config = ShardConfig(RuleSpec.parse("asgd", {"lr": "1.0"}), consistency=Consistency(ConsistencyModel.BSP))
    shard = Shard(config, observer=recorder)
    a, b = join(shard, "a"), join(shard, "b")
    init(shard, a)
    thread, _ = in_thread(push, shard, a, 1, [1.0, 0.0, 0.0, 0.0])
    thread.join(0.3)
    push(shard, b, 1, [0.0, 1.0, 0.0, 0.0])
    thread.join(5)
    assert recorder.updates == [1]
    assert sorted(recorder.pushes) == ["a", "b"]


def test_bsp_with_atomic_gem_releases_each_reservation_when_its_holder_pushes() -> None:
    # The fake clock never moves, so a reservation left behind would hold the other pulls forever.
    clock = FakeClock()
    config = ShardConfig(
        RuleSpec.parse("gem", {"lr": "1.0", "atomic": "true"}),
        consistency=Consistency(ConsistencyModel.BSP),
        exclusive_pull_seconds=1000.0,
    )
    shard = Shard(config, clock)
    a, b = join(shard, "a"), join(shard, "b")
    init(shard, a)

    def delta_push(worker_id: int, push_id: int, values: list[float]) -> PushOutcome:
        return shard.push(
            PushHeader(worker_id, push_id, 0, int(PayloadKind.DELTA), LAYOUT.hash, {}),
            codec.encode(torch.tensor(values)),
        )

    shard.pull(a, FP32, exclusive=True)
    pushed, pushed_results = in_thread(delta_push, a, 1, [2.0, 0.0, 0.0, 0.0])
    thread, results = in_thread(shard.pull, b, FP32, True)
    thread.join(2.0)
    assert not thread.is_alive() and results and results[0].clock == 0  # type: ignore[attr-defined]
    assert pushed.is_alive() and shard.clock == 0  # a waits at the barrier for b
    second = delta_push(b, 1, [0.0, 4.0, 0.0, 0.0])
    pushed.join(5)
    first = pushed_results[0]
    assert isinstance(first, PushOutcome) and first.clock == second.clock == 1
    torch.testing.assert_close(shard.params, torch.tensor([1.0, 2.0, 0.0, 0.0]))
    # Nobody holds a reservation after the round: the next reserved pulls go straight through.
    shard.pull(a, FP32, exclusive=True)
    thread, results = in_thread(shard.pull, b, FP32, True)
    pushed, _ = in_thread(delta_push, a, 2, [0.0, 0.0, 0.0, 0.0])
    thread.join(2.0)
    assert not thread.is_alive() and results and results[0].clock == 1  # type: ignore[attr-defined]
    delta_push(b, 2, [0.0, 0.0, 0.0, 0.0])
    pushed.join(5)
    assert shard.clock == 2
