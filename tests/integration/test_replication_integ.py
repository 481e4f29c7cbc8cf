"""Replicated shards with real processes on 127.0.0.1: one etcd, three replicas of one shard, three
workers given the replica set; the primary killed (SIGKILL) five times: nothing acknowledged is
lost or applied twice, and the workers train as well as without failures."""

from __future__ import annotations

import random
import signal
import time
from pathlib import Path

import pytest

from pstools.warm_start import Program
from tests.integration.probes import status, wait_for
from tests.integration.replica_sets import ReplicaSet
from tests.integration.test_faults_integ import finish
from tests.integration.workers import WarmTrain, train_command

pytestmark = pytest.mark.integration


def start_worker(
    servers: str, name: str, log: Path, until_clock: int, seed: int = 0, step_seconds: float = 0.1
) -> WarmTrain:
    """A digits worker given the replica set, paced (``step_seconds`` a step) so the failovers fall mid-run."""
    settings = {"train": {"step_seconds": step_seconds, "client": {"retry": {"give_up_seconds": 120}}}}
    command = train_command(servers, name, until_clock, seed=seed, log=log, settings=settings)
    return WarmTrain(command, log.with_suffix(".out"))


def test_five_primaries_killed_at_random_lose_and_double_nothing(
    replicas: ReplicaSet, processes: list[Program]
) -> None:
    """kill -9 of the primary five times while three workers train; each time the killed replica is
    started again, and the next kill waits for a backup in sync."""
    replicas.in_sync(2)
    until = 900  # three workers' 300 steps each: above 90 % on any seed, as the single-server tests' 1000
    workers = [
        start_worker(replicas.servers, f"w{i}", replicas.tmp_path / f"w{i}.jsonl", until, seed=i, step_seconds=0.08)
        for i in range(3)
    ]
    processes.extend(workers)
    rng = random.Random(5)
    kills = []
    for kill in range(5):
        threshold = 60 + 100 * kill + rng.randrange(30)
        # One backup in sync is enough to lose nothing; the replica killed last catches up meanwhile.
        primary = replicas.in_sync(1)
        address, at_least = replicas.addresses[primary], threshold
        wait_for(lambda: status(address).clock >= at_least, 120, f"clock {at_least}")  # noqa: B023
        clock = status(replicas.addresses[primary]).clock
        process = replicas.processes[primary]
        assert process is not None
        process.send_signal(signal.SIGKILL)
        process.wait()
        killed_at = time.monotonic()
        successor = replicas.primary()
        kills.append((clock, time.monotonic() - killed_at))
        assert successor != primary
        replicas.start(primary)
    summaries = [finish(worker, timeout=240) for worker in workers]
    final = status(replicas.addresses[replicas.in_sync(2)])
    acknowledged = sum(int(s["pushes"]) for s in summaries)
    print(f"\nkilled at clocks (and seconds to a new primary): {kills}; {acknowledged} pushes acknowledged")
    assert all(clock < until - 50 for clock, _ in kills), "a kill came after the training"
    assert final.replica.epoch >= 6  # five failovers after the first election
    assert final.applied_pushes == acknowledged == final.clock
    for summary in summaries:
        assert summary["test_accuracy"] >= 0.90, summary
    # Each backup holds the primary's version once it is idle.
    versions = {status(address).replica.version for address in replicas.addresses}
    assert len(versions) == 1, versions
