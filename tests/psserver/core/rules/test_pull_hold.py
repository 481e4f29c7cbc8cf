"""Delayed Nesterov's ``pull_grace``: pushes that land together are all applied before their workers pull."""

from __future__ import annotations

import threading

import pytest
import torch

from psproto import codec
from psserver.core.consistency import Consistency, ConsistencyModel
from psserver.core.local_steps import WorkerPaces
from psserver.core.observer import NullObserver
from psserver.core.rules import PayloadKind, RuleOptionError, RuleSpec
from psserver.core.rules._pull_hold import PULL_GRACE_UNDER_BSP, PullHolds
from psserver.core.rules._windowed import DYLU_UNDER_BSP
from psserver.core.rules.base import PullHold, ShardView
from psserver.core.rules.diloco import DelayedNesterov
from psserver.core.shard import Shard, ShardConfig
from psserver.core.workers import WorkerRecord
from tests.psserver.core.test_shard import LAYOUT, FakeClock, push, upload

DELTA = int(PayloadKind.DELTA)
LENGTH = 8  # LAYOUT: w (2, 3) and b (2,)


def _rule(**options: str) -> DelayedNesterov:
    rule = RuleSpec.parse("diloco-dn", options).build(LENGTH)
    assert isinstance(rule, DelayedNesterov)
    return rule


def test_pushes_within_the_grace_of_a_batchs_first_share_its_end() -> None:
    holds = PullHolds(2.5, lambda worker_id, view: None)

    def at(now: float, worker_id: int = 1) -> PullHold | None:
        holds.after_push(worker_id, now)
        return holds.of(worker_id)

    # The push at 10 s opens a batch that ends at 12.5 s; one at 11 s joins it, with the same end.
    assert at(10.0) == PullHold(until_time=12.5)
    assert at(11.0, 2) == PullHold(until_time=12.5)
    assert at(12.5, 3) == PullHold(until_time=12.5)  # at its very end: still within the grace
    assert at(12.6) == PullHold(until_time=15.1)  # the batch ended: a new one
    off = PullHolds(0.0, lambda worker_id, view: None)
    off.after_push(1, 10.0)
    assert off.of(1) is None  # grace 0: pull at once
    assert _rule(period="4").paced_window is None and _rule(pull_grace="1").paced_window == 20


def test_consistency_refusal_names_whichever_scheduling_option_bsp_cannot_run() -> None:
    def refusal(options: dict[str, str], model: ConsistencyModel) -> str | None:
        return RuleSpec.parse("diloco-dn", options).options.consistency_refusal(model)

    assert refusal({"dylu": "true"}, ConsistencyModel.BSP) == DYLU_UNDER_BSP
    assert refusal({"pull_grace": "0.5"}, ConsistencyModel.BSP) == PULL_GRACE_UNDER_BSP
    assert refusal({"dylu": "true", "pull_grace": "0.5"}, ConsistencyModel.BSP) == DYLU_UNDER_BSP
    assert refusal({"dylu": "true", "pull_grace": "0.5"}, ConsistencyModel.ASYNC) is None
    assert refusal({}, ConsistencyModel.BSP) is None


def test_pull_grace_is_refused_under_bsp_and_when_negative() -> None:
    with pytest.raises(ValueError, match="pull_grace is for asynchronous training"):
        Shard(
            ShardConfig(RuleSpec.parse("diloco-dn", {"pull_grace": "1"}), consistency=Consistency(ConsistencyModel.BSP))
        )
    with pytest.raises(RuleOptionError, match="pull_grace"):
        RuleSpec.parse("diloco-dn", {"pull_grace": "-1"})


def test_a_hold_lasts_while_another_worker_is_due_to_join_the_batch() -> None:
    clock = FakeClock()
    paces = WorkerPaces()
    rule = _rule(window="10", dylu="true", pull_grace="2.5")
    view = ShardView(clock, lambda: [1, 2], paces)
    holds = rule.holds
    holds.after_push(2, 5.0)  # worker 2 was held in an earlier batch (ends 7.5 s) and pulled
    assert holds.release(2) and holds.of(2) == PullHold(until_time=7.5, released=True)
    clock.now = 10.0
    holds.after_push(1, 10.0)  # worker 1 opens a batch that ends at 12.5 s
    assert holds.active(1, view) is None  # the other's pace is not known: it is not waited for
    # The other worker took 10 steps in 10 s and started its next window at 10 s: due at 20 s.
    paces.observe(2, header_at=0.0, steps_done=10.0, now=0.0, live=[1, 2], window=10)
    paces.observe(2, header_at=10.0, steps_done=10.0, now=10.0, live=[1, 2], window=10)
    assert paces.next_push_at(2, rule.assigned_window(2, view)) == 20.0
    assert holds.active(1, view) is None  # it cannot join the batch before 12.5 s: pull now
    paces.observe(2, header_at=10.5, steps_done=10.0, now=11.0, live=[1, 2], window=10)  # 20 steps/s: due 11.5 s
    # Released from an earlier batch, it may join this one: waited for.
    assert holds.active(1, view) == PullHold(until_time=12.5)
    holds.after_push(2, 11.0)  # it joined: a held worker pushes nothing until it pulls
    assert holds.active(1, view) is None
    assert holds.release(2)  # released from this batch: it cannot join it again
    assert holds.active(1, view) is None
    holds.forget(2)  # left (and joined again): waited for
    assert holds.active(1, view) == PullHold(until_time=12.5)
    clock.now = 12.5  # the batch ended
    assert holds.active(1, view) is None


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
