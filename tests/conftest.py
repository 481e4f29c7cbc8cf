"""Fixtures shared across the test packages, and the two test tiers.

A test belongs to the integration tier when its file name ends in ``_integ.py``: it may start
processes and servers on 127.0.0.1 and run external tools. Every other test is a unit test: no
subprocess, no socket, no gRPC server or channel (``make test-fast`` runs them alone). The tier is
marked here (``integration``) and the rule enforced in every run: a unit test that starts a
process, connects or binds a socket, or creates a gRPC server or channel fails and names the call.
Unit tests run first, so no thread an integration test left behind can fail one.
"""

from __future__ import annotations

import multiprocessing.process
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
import torch

from psproto import inline_ops

INTEGRATION_SUFFIX = "_integ.py"
TESTS_DIR = Path(__file__).parent

# Tests run torch on one intra-op thread (``two_threads`` gives a test two): their tensors are small,
# and where the cores are shared a second OpenMP thread spins waiting for one (a simulation test that
# takes 0.6 s on one thread took 16 s on two on a busy 2-core machine).
torch.set_num_threads(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name.endswith(INTEGRATION_SUFFIX):
            item.add_marker(pytest.mark.integration)
        elif item.get_closest_marker("integration") is not None:
            raise pytest.UsageError(f"{item.nodeid} is marked integration: name its file *{INTEGRATION_SUFFIX} instead")
    items.sort(key=_order)


# The integration modules that run longest (a minute or more on a 2-core host, where the suite keeps
# both cores busy), handed to pytest-xdist's workers first: a run then ends with the many short
# modules spread over every worker, not with one long module going on alone.
LONGEST_FIRST = (
    "integration/test_rules_cluster_integ.py",
    "pstools/on_ray/test_ray_job_integ.py",
    "benchmarks/test_throughput_smoke_integ.py",
    "integration/test_node_worker_integ.py",
    "integration/test_replication_integ.py",
    "integration/test_faults_integ.py",
)


def _order(item: pytest.Item) -> tuple[bool, int]:
    """Unit tests first, then the longest integration modules, then the rest (a stable sort keeps their order)."""
    module = item.path.relative_to(TESTS_DIR).as_posix()
    longest = LONGEST_FIRST.index(module) if module in LONGEST_FIRST else len(LONGEST_FIRST)
    return item.get_closest_marker("integration") is not None, longest


class UnitTierError(Exception):
    """A unit test reached for a process, a socket or a gRPC server or channel."""


class _Guard:
    """Refuses, while a unit test runs, every way out of the process a test could take.

    The patches stay installed for the whole session and act only while ``active`` is set, so a
    module- or session-scoped fixture that starts a server is caught in the first test using it.
    gRPC is refused at its constructors because its C core opens sockets without Python's
    ``socket`` module. What was refused is also recorded: a test that swallows the exception (or
    a background thread that hits it) still fails.
    """

    def __init__(self) -> None:
        self.active = False
        self.caught: list[str] = []
        self._lock = threading.Lock()

    def refusing(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            if not self.active:
                return original(*args, **kwargs)
            message = f"unit test called {name}: name the file *{INTEGRATION_SUFFIX} or test the core without it"
            with self._lock:
                self.caught.append(message)
            raise UnitTierError(message)

        return refuse

    def take(self) -> list[str]:
        with self._lock:
            caught, self.caught = self.caught, []
        return caught


# (owner, attribute) pairs the guard replaces; each way a test could leave the process once.
_GUARDED: tuple[tuple[Any, str], ...] = (
    (subprocess.Popen, "_execute_child"),  # every subprocess call, os.popen, asyncio subprocesses
    (os, "fork"),
    (os, "forkpty"),
    (os, "posix_spawn"),
    (os, "posix_spawnp"),
    (os, "system"),
    (multiprocessing.process.BaseProcess, "start"),  # every start method and process pool
    (socket.socket, "connect"),  # create_connection, http clients
    (socket.socket, "connect_ex"),
    (socket.socket, "bind"),  # every listening server (http.server, prometheus_client)
    (socket.socket, "sendto"),
    (grpc, "server"),
    (grpc, "insecure_channel"),
    (grpc, "secure_channel"),
    (grpc.aio, "server"),
    (grpc.aio, "insecure_channel"),
    (grpc.aio, "secure_channel"),
)

_guard = _Guard()


@pytest.fixture(scope="session", autouse=True)
def _unit_guard() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        for owner, attribute in _GUARDED:
            name = f"{getattr(owner, '__name__', owner)}.{attribute}"
            patch.setattr(owner, attribute, _guard.refusing(name, getattr(owner, attribute)))
        yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    _guard.active = item.get_closest_marker("integration") is None
    try:
        return (yield)
    finally:
        _guard.active = False


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    caught = _guard.take()
    if caught and report.passed:
        report.outcome = "failed"
        report.longrepr = "\n".join(caught)
    return report


@pytest.fixture
def two_threads() -> Iterator[None]:
    """torch's intra-op pool at two threads for the test (skipped where the pool is not OpenMP's)."""
    if inline_ops._openmp() is None:
        pytest.skip("torch's intra-op pool is not OpenMP here")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)
