"""Delayed Nesterov's ``pull_grace``: pushes that land together are all applied before their workers pull."""

from __future__ import annotations

import threading

import pytest
import torch

from psproto import codec
from psserver.core.consistency import Consistency, ConsistencyModel
from psserver.core.local_steps import DYLU_UNDER_BSP, DyluSettings, LocalSteps
from psserver.core.observer import NullObserver
from psserver.core.pull_hold import PULL_GRACE_UNDER_BSP, PullHold, PullHolds, consistency_refusal, pull_grace_refusal
from psserver.core.rules import PayloadKind, RuleOptionError, RuleOptions, RuleSpec, UpdateRule
from psserver.core.shard import Shard, ShardConfig
from psserver.core.workers import WorkerRecord
from tests.psserver.core.test_shard import LAYOUT, FakeClock, push, upload

DELTA = int(PayloadKind.DELTA)
LENGTH = 8  # LAYOUT: w (2, 3) and b (2,)


def _rule(**options: str) -> UpdateRule[RuleOptions]:
    return RuleSpec.parse("diloco-dn", options).build(LENGTH)


def test_pushes_within_the_grace_of_a_batchs_first_share_its_end() -> None:
    rule = _rule(period="4", pull_grace="2.5")
    clock = FakeClock()
    holds = PullHolds(clock, list, LocalSteps(None))

    def at(now: float) -> PullHold | None:
        clock.now = now
        return holds.after_push(rule)

    # The push at 10 s opens a batch that ends at 12.5 s; one at 11 s joins it, with the same end.
    assert at(10.0) == PullHold(until_time=12.5)
    assert at(11.0) == PullHold(until_time=12.5)
    assert at(12.5) == PullHold(until_time=12.5)  # at its very end: still within the grace
    assert at(12.6) == PullHold(until_time=15.1)  # the batch ended: a new one
    assert holds.after_push(_rule(period="4")) is None  # grace 0: pull at once
    assert holds.after_push(RuleSpec.parse("diloco", {}).build(LENGTH)) is None
    assert holds.after_push(None) is None


def test_consistency_refusal_names_whichever_scheduling_option_bsp_cannot_run() -> None:
    def refusal(options: dict[str, str], model: ConsistencyModel) -> str | None:
        return consistency_refusal(RuleSpec.parse("diloco-dn", options).options, model)

    assert refusal({"dylu": "true"}, ConsistencyModel.BSP) == DYLU_UNDER_BSP
    assert refusal({"pull_grace": "0.5"}, ConsistencyModel.BSP) == PULL_GRACE_UNDER_BSP
    assert refusal({"dylu": "true", "pull_grace": "0.5"}, ConsistencyModel.BSP) == DYLU_UNDER_BSP
    assert refusal({"dylu": "true", "pull_grace": "0.5"}, ConsistencyModel.ASYNC) is None
    assert refusal({}, ConsistencyModel.BSP) is None


def test_pull_grace_is_refused_under_bsp_and_when_negative() -> None:
    options = RuleSpec.parse("diloco-dn", {"pull_grace": "1"}).options
    assert pull_grace_refusal(options, ConsistencyModel.BSP) == PULL_GRACE_UNDER_BSP
    assert pull_grace_refusal(options, ConsistencyModel.ASYNC) is None
    assert pull_grace_refusal(RuleSpec.parse("diloco-dn", {}).options, ConsistencyModel.BSP) is None
    with pytest.raises(ValueError, match="pull_grace is for asynchronous training"):
        Shard(
            ShardConfig(RuleSpec.parse("diloco-dn", {"pull_grace": "1"}), consistency=Consistency(ConsistencyModel.BSP))
        )
    with pytest.raises(RuleOptionError, match="pull_grace"):
        RuleSpec.parse("diloco-dn", {"pull_grace": "-1"})


def test_a_hold_lasts_while_another_worker_is_due_to_join_the_batch() -> None:
    clock = FakeClock()
    clock.now = 10.0
    local_steps = LocalSteps(DyluSettings(window=10, minimum=1, reference="max"))
    held = WorkerRecord(1, "a", "cpu", False, pull_hold=PullHold(until_time=12.5))
    other = WorkerRecord(2, "b", "cpu", False)
    holds = PullHolds(clock, lambda: [held, other], local_steps)
    assert holds.active(held) is None  # the other's pace is not known: it is not waited for
    # The other worker took 10 steps in 10 s and started its next window at 10 s: due at 20 s.
    local_steps.observe(2, header_at=0.0, steps_done=10.0, now=0.0, live=[held, other])
    local_steps.observe(2, header_at=10.0, steps_done=10.0, now=10.0, live=[held, other])
    assert local_steps.next_push_at(2) == 20.0
    assert holds.active(held) is None  # it cannot join the batch before 12.5 s: pull now
    local_steps.observe(2, header_at=10.5, steps_done=10.0, now=11.0, live=[held, other])  # 20 steps/s: due 11.95 s
    assert holds.active(held) == PullHold(until_time=12.5)
    other.pull_hold = PullHold(until_time=12.5)  # a held worker pushes nothing until it pulls
    assert holds.active(held) is None
    other.pull_hold = PullHold(until_time=12.5, released=True)  # released from this batch: it cannot join again
    assert holds.active(held) is None
    other.pull_hold = PullHold(until_time=9.0, released=True)  # released from an earlier one: it may
    assert holds.active(held) == PullHold(until_time=12.5)
    clock.now = 12.5  # the batch ended
    assert holds.active(held) is None


def test_without_dylu_the_shard_measures_paces_only_for_pull_grace() -> None:
    assert LocalSteps.of(ShardConfig(RuleSpec.parse("diloco-dn", {"pull_grace": "1"})))._window == 20
    assert LocalSteps.of(ShardConfig(RuleSpec.parse("diloco-dn", {})))._window is None


class _HoldRecorder(NullObserver):
    def __init__(self) -> None:
        self.held: list[tuple[str, float]] = []

    def pull_held(self, worker: WorkerRecord, seconds: float) -> None:
        self.held.append((worker.name, seconds))


def _two_workers(clock: FakeClock, observer: NullObserver | None = None) -> Shard:
    """Period 2, window 10: each worker pushed at 100 s and 110 s, so the shard knows both paces
    (1 step/s, next pushes due at 120 s); the clock is at 120 s and the shard's at 4."""
    spec = RuleSpec.parse("diloco-dn", {"period": "2", "window": "10", "pull_grace": "5", "lr": "1", "momentum": "0.5"})
    shard = Shard(ShardConfig(spec), clock_source=clock, observer=observer)
    first = shard.join("a", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    shard.join("b", "cpu", False, LAYOUT, LAYOUT.hash)
    upload(shard, first, torch.zeros(LENGTH))
    for push_id, now in ((1, 100.0), (2, 110.0)):
        clock.now = now
        for worker_id in (1, 2):
            assert shard.pull_hold(worker_id) is None  # a pace not yet known is not waited for
            push(shard, worker_id, push_id, 0, torch.zeros(LENGTH), kind=DELTA)
            shard.pull(worker_id, codec.FLOAT32)
    clock.now = 120.0
    return shard


def _pull_in_thread(shard: Shard, worker_id: int) -> tuple[threading.Thread, list[int]]:
    clocks: list[int] = []
    thread = threading.Thread(target=lambda: clocks.append(shard.pull(worker_id, codec.FLOAT32).clock), daemon=True)
    thread.start()
    return thread, clocks


def test_the_pull_waits_for_the_other_workers_push_and_gets_the_momentum_step() -> None:
    clock = FakeClock()
    recorder = _HoldRecorder()
    shard = _two_workers(clock, recorder)
    before = shard.params.clone()
    push(shard, 1, 3, 4, torch.ones(LENGTH), kind=DELTA)
    assert shard.pull_hold(1) == PullHold(until_time=125.0)  # worker 2 is due at 120 s
    thread, clocks = _pull_in_thread(shard, 1)
    thread.join(0.5)
    assert thread.is_alive() and not clocks  # held: the other worker should push within the grace
    clock.now = 121.0
    push(shard, 2, 3, 4, torch.ones(LENGTH), kind=DELTA)  # joins the batch and closes the period
    thread.join(5)
    assert clocks == [6]  # the parameters after both pushes and the momentum step
    assert shard.pull_hold(2) is None  # worker 1 was in this batch: nobody else can join it
    assert recorder.held == [("a", 1.0)]  # observed: held from 120 s to 121 s (the metric's histogram)
    # The warm-up pushes were zeros, so m = 0 before. Δ = +1 each, g = −1; push 1: θ −= 1·(−1/2);
    # push 2 closes: a/N = −1, m = −1, θ −= 1·(0.5·(−1) + (−1/2)): θ = before + 1.5 (c = 0).
    torch.testing.assert_close(shard.params, before + 1.5)


def test_the_pull_goes_ahead_when_the_grace_runs_out() -> None:
    clock = FakeClock()
    shard = _two_workers(clock)
    push(shard, 1, 3, 4, torch.ones(LENGTH), kind=DELTA)
    thread, clocks = _pull_in_thread(shard, 1)
    thread.join(0.5)
    assert thread.is_alive()
    clock.now = 125.0  # the grace (5 s) after the push at 120 s
    thread.join(5)
    assert clocks == [5]  # without the other worker's push: the grace bounds the wait
    assert shard.pull_hold(1) is None


def test_without_pull_grace_a_pull_never_waits() -> None:
    spec = RuleSpec.parse("diloco-dn", {"period": "2"})
    shard = Shard(ShardConfig(spec))
    first = shard.join("a", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    shard.join("b", "cpu", False, LAYOUT, LAYOUT.hash)
    upload(shard, first, torch.zeros(LENGTH))
    push(shard, first, 1, 0, torch.ones(LENGTH), kind=DELTA)
    assert shard.pull_hold(first) is None
    assert shard.pull(first, codec.FLOAT32).clock == 1
