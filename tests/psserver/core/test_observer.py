"""One hook mechanism: every observer hears every event; subscribers come and go."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from psproto import codec
from psproto.layout import Layout
from psserver.core.observer import NullObserver, Observers
from psserver.core.rules import PayloadKind, RuleSpec
from psserver.core.shard import PushHeader, Shard, ShardConfig
from psserver.core.workers import WorkerRecord

LAYOUT = Layout.from_named_shapes([("w", (4,))])


class Recorder(NullObserver):
    def __init__(self) -> None:
        self.events: list[str] = []
        self.states: list[dict[str, Any]] = []

    def worker_joined(self, worker: WorkerRecord) -> None:
        self.events.append(f"joined {worker.name}")

    def update_committed(self, clock: int, capture_state: Callable[[], dict[str, Any]]) -> None:
        self.events.append(f"committed {clock}")
        self.states.append(capture_state())


def test_observers_hear_every_event_in_order_until_removed() -> None:
    first, second = Recorder(), Recorder()
    observers = Observers(first)
    remove = observers.add(second)
    observers.worker_joined(WorkerRecord(1, "a", "cpu", False))
    remove()
    observers.worker_joined(WorkerRecord(2, "b", "cpu", False))
    assert first.events == ["joined a", "joined b"] and second.events == ["joined a"]


def test_a_subscriber_gets_the_state_of_each_committed_update_with_its_push_id() -> None:
    shard = Shard(ShardConfig(RuleSpec.parse("asgd", {"lr": "1"})))
    recorder = Recorder()
    unsubscribe = shard.subscribe(recorder)
    worker = shard.join("a", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    assembler = shard.begin_upload(worker, LAYOUT.hash)
    for chunk in codec.encode(torch.zeros(4)):
        shard.decode_chunk(assembler, chunk)
    shard.finish_upload(assembler)
    shard.push(PushHeader(worker, 7, 0, int(PayloadKind.GRADIENT), LAYOUT.hash, {}), codec.encode(torch.ones(4)))
    unsubscribe()
    assert recorder.events == ["joined a", "committed 1"]
    (state,) = recorder.states
    assert state["clock"] == 1 and state["memories"]["a"]["recent"][0][0] == 7
    assert torch.equal(state["params"], -torch.ones(4))
