"""Refusals are counted once, by reason, and raised marked as counted."""

from __future__ import annotations

import pytest

from psserver.core.errors import ErrorKind, ShardError
from psserver.core.observer import NullObserver
from psserver.core.refusals import Refusals
from psserver.core.workers import WorkerRecord


class Recorder(NullObserver):
    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None]] = []

    def rejected(self, reason: str, worker: WorkerRecord | None) -> None:
        self.seen.append((reason, worker.name if worker else None))


def test_a_refusal_is_counted_reported_and_raised() -> None:
    recorder = Recorder()
    refusals = Refusals(recorder)
    worker = WorkerRecord(1, "a", "cpu", False)
    with pytest.raises(ShardError, match="no such thing") as refused:
        refusals.refuse(ErrorKind.BAD_REQUEST, "no such thing", worker)
    assert refused.value.kind is ErrorKind.BAD_REQUEST and refused.value.counted
    refusals.count("unauthenticated")
    counts = refusals.counts()
    assert counts == {"bad_request": 1, "unauthenticated": 1}
    counts["bad_request"] = 9  # a copy
    assert refusals.counts()["bad_request"] == 1
    assert recorder.seen == [("bad_request", "a"), ("unauthenticated", None)]
