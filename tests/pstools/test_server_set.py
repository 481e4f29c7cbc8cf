"""The local cluster's ServerSet: which exited servers it starts again, where, and how often."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import pytest

from pstools import server_set
from pstools.server_set import MAX_RESTARTS, Server, ServerSet
from pstools.warm_start import WarmProcess


class Process:
    """A process standing in for a server's: it has exited with ``code`` (None: still running)."""

    def __init__(self, code: int | None = None) -> None:
        self.code = code

    def poll(self) -> int | None:
        return self.code


class Relaunches:
    """A replica's relaunch standing in: records each call; gives a running process, or None
    (it did not start) while ``fail`` says so."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[list[str], str]] = []
        self.fail = fail

    def __call__(self, more_args: Sequence[str], log_name: str) -> WarmProcess | None:
        self.calls.append((list(more_args), log_name))
        return None if self.fail else cast(WarmProcess, Process())


def _server(code: int | None, relaunch: Relaunches | None, address: str = "127.0.0.1:41000") -> Server:
    return Server(cast(WarmProcess, Process(code)), address, "server-0-1.log", relaunch)


def test_an_exited_replica_starts_again_at_its_port_with_a_log_of_its_own() -> None:
    relaunch = Relaunches()
    deposed, running = _server(75, relaunch), _server(None, Relaunches(), "127.0.0.1:41001")
    servers = ServerSet()
    servers.add(deposed)
    servers.add(running)
    servers.restart_exited()
    assert relaunch.calls == [(["--port", "41000"], "server-0-1.restart-1.log")]
    assert cast(Any, deposed.process).poll() is None, "the new process replaced the one that exited"
    assert (servers.restarts, running.restarts) == (1, 0)
    servers.restart_exited()
    assert len(relaunch.calls) == 1, "a running replica is left alone"


def test_a_lone_server_is_not_started_again() -> None:
    servers = ServerSet()
    servers.add(_server(-9, None))
    servers.restart_exited()
    assert servers.restarts == 0


def test_a_replica_that_does_not_start_is_tried_again_then_left_down(caplog: pytest.LogCaptureFixture) -> None:
    relaunch = Relaunches(fail=True)
    servers = ServerSet()
    servers.add(_server(1, relaunch))
    for _ in range(MAX_RESTARTS + 2):
        servers.restart_exited()
    assert [log for _, log in relaunch.calls] == [f"server-0-1.restart-{n}.log" for n in range(1, MAX_RESTARTS + 1)]
    assert servers.restarts == MAX_RESTARTS
    assert "did not start again; see server-0-1.restart-3.log" in caplog.text


def test_stop_ends_the_watch_before_it_stops_the_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    stopped: list[object] = []
    monkeypatch.setattr(server_set, "stop_process", lambda process: stopped.append(process) or 0)
    monkeypatch.setattr(server_set, "POLL_S", 0.01)
    relaunch = Relaunches()
    servers = ServerSet()
    replica = _server(None, relaunch)
    servers.add(replica)
    servers.watch()
    cast(Any, replica.process).code = -9  # killed while watched
    assert servers.stop() == [0]
    assert stopped == [replica.process]
    assert servers._thread is not None and not servers._thread.is_alive()
