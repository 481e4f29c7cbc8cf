"""A link that goes silent (no RST, no FIN) under training workers, with real processes on 127.0.0.1.

Three ``psworker train`` processes reach a real ``psserver serve`` through a proxy that is told to
stop forwarding while keeping every connection open. Each worker must notice within twice its
keepalive interval (its log line arrives), carry on once the path works again, and every push a
worker counted as acknowledged must be applied exactly once on the server.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pstools.launcher import start_server
from pstools.warm_start import stop_process
from tests.integration.probes import status, wait_for
from tests.integration.tcp_proxy import BlackHoleProxy
from tests.integration.workers import start_train, train_command

pytestmark = pytest.mark.integration

KEEPALIVE_S = 1.0
SILENT_S = 4.0  # long enough for reconnection attempts to meet the silent link too
UNTIL_CLOCK = 220
WORKERS = 3


@dataclass
class Worker:
    """A ``psworker train`` process whose stderr lines are timestamped as they arrive."""

    name: str
    process: subprocess.Popen[str]
    lines: list[tuple[float, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append((time.monotonic(), line.rstrip()))

    def first_line_after(self, since: float, text: str) -> tuple[float, str] | None:
        return next(((at, line) for at, line in list(self.lines) if at >= since and text in line), None)

    def finish(self, timeout: float) -> dict[str, Any]:
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} did not finish in {timeout} s: {self.stderr()[-2000:]}") from None
        self.reader.join(5)
        assert self.process.returncode == 0, self.stderr()[-3000:]
        assert self.process.stdout is not None
        summary: dict[str, Any] = json.loads(self.process.stdout.read().strip().splitlines()[-1])
        return summary

    def stderr(self) -> str:
        return "\n".join(line for _, line in self.lines)


def start_worker(address: str, name: str, seed: int) -> Worker:
    client = {"retry": {"give_up_seconds": 60}, "keepalive_seconds": KEEPALIVE_S}
    return Worker(
        name, start_train(train_command(address, name, UNTIL_CLOCK, seed=seed, settings={"train": {"client": client}}))
    )


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        if worker.process.poll() is None:
            worker.process.kill()
            worker.process.wait()


def test_workers_notice_a_silent_link_carry_on_after_it_and_lose_or_repeat_no_push(
    tmp_path: Path, workers: list[Worker]
) -> None:
    server, address = start_server(tmp_path, "asgd", 0.05, ())
    try:
        host, port = address.rsplit(":", 1)
        with BlackHoleProxy((host, int(port))) as proxy:
            workers.extend(start_worker(proxy.address, f"w{i}", seed=i) for i in range(WORKERS))
            wait_for(
                lambda: len(status(address).workers) == WORKERS and status(address).clock >= 100,
                60,
                "every worker training",
            )

            silenced = proxy.black_hole()
            time.sleep(0.5)  # pushes already through the proxy are applied; nothing else arrives
            clock_in_silence = status(address).clock
            noticed: dict[str, tuple[float, str]] = {}
            for worker in workers:
                wait_for(
                    lambda w=worker: w.first_line_after(silenced, "no answer") is not None,
                    2 * KEEPALIVE_S + 3,
                    f"{worker.name} to notice the silent link",
                )
                noticed[worker.name] = worker.first_line_after(silenced, "no answer") or (0.0, "")
            time.sleep(max(0.0, silenced + SILENT_S - time.monotonic()))
            assert status(address).clock == clock_in_silence, "the proxy let traffic through while silent"
            proxy.restore()
            restored = time.monotonic()
            wait_for(lambda: status(address).clock > clock_in_silence, 10, "training to go on after the restore")
            resumed = time.monotonic()

            summaries = [worker.finish(timeout=60) for worker in workers]
            finished = time.monotonic()
        reply = status(address)
    finally:
        assert stop_process(server) == 0

    for name, (at, line) in sorted(noticed.items()):
        print(f"\n{name} noticed the silent link after {at - silenced:.2f} s: {line}")
    acknowledged = sum(int(s["pushes"]) for s in summaries)
    duplicates = sum(int(s["duplicate_acks"]) for s in summaries)
    reconnects = [int(s["reconnects"]) for s in summaries]
    print(
        f"\nsilent {SILENT_S:.0f} s at clock {clock_in_silence}; training resumed {resumed - restored:.1f} s and "
        f"finished {finished - restored:.1f} s after the restore; {proxy.connections} connections; reconnects "
        f"{reconnects}; {acknowledged} pushes acknowledged ({duplicates} as duplicates); server applied "
        f"{reply.applied_pushes}, clock {reply.clock}"
    )
    for name, (at, line) in noticed.items():
        assert at - silenced <= 2 * KEEPALIVE_S, f"{name} noticed after {at - silenced:.2f} s: {line}"
        assert "shard 0" in line and "UNAVAILABLE" in line, line
    for summary in summaries:
        assert int(summary["final_clock"]) >= UNTIL_CLOCK, summary
        assert int(summary["reconnects"]) >= 1, summary
    # Exactly once: every acknowledged push applied once, repeats acknowledged without being applied.
    assert reply.applied_pushes == acknowledged
    assert reply.clock == acknowledged  # asgd: one update per applied push
    assert proxy.connections > WORKERS  # every worker came back on a new connection
