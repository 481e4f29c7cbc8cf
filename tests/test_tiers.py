"""The two test tiers: files named *_integ.py are integration tests, and a unit test that starts a
process, opens a socket or makes a gRPC server or channel fails (tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

CONFTEST = Path(__file__).with_name("conftest.py")
# The inner runs load no plugin they do not need (hypothesis's would import it afresh each time).
QUIET = ("-p", "no:cacheprovider", "-p", "no:hypothesispytest")

UNIT_TESTS = """
import multiprocessing
import os
import socket
import subprocess

import grpc
import grpc.aio


def test_pure():
    assert sum(range(4)) == 6


def test_subprocess():
    subprocess.run(["true"], check=True)


def test_fork():
    if os.fork() == 0:
        os._exit(0)


def test_multiprocessing():
    multiprocessing.get_context("spawn").Process(target=print).start()


def test_socket_bind():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))


def test_socket_connect():
    socket.create_connection(("127.0.0.1", 9), timeout=0.1)


def test_grpc_server():
    grpc.server(None)


def test_grpc_channel():
    grpc.insecure_channel("127.0.0.1:9")


def test_grpc_aio_channel():
    grpc.aio.insecure_channel("127.0.0.1:9")


def test_swallowed():
    try:
        subprocess.run(["true"])
    except Exception:
        pass


def test_socketpair():
    left, right = socket.socketpair()
    left.close()
    right.close()
"""

INTEG_TESTS = """
def test_marked(request):
    assert request.node.get_closest_marker("integration") is not None
"""


# What each test of UNIT_TESTS reaches for, as the guard names it.
CALLS = {
    "test_subprocess": "unit test called Popen._execute_child",
    "test_fork": "unit test called os.fork",
    "test_multiprocessing": "unit test called BaseProcess.start",
    "test_socket_bind": "unit test called socket.bind",
    "test_socket_connect": "unit test called socket.connect",
    "test_grpc_server": "unit test called grpc.server",
    "test_grpc_channel": "unit test called grpc.insecure_channel",
    "test_grpc_aio_channel": "unit test called grpc.aio.insecure_channel",
    "test_swallowed": "unit test called Popen._execute_child",
}


@pytest.fixture
def tiers(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST.read_text())
    # Collected first by name, the integration file must still run last.
    pytester.makepyfile(test_early_integ=INTEG_TESTS, test_unit=UNIT_TESTS)
    return pytester


def test_the_guard_fails_each_unit_test_that_leaves_the_process(tiers: pytest.Pytester) -> None:
    reports = tiers.inline_run(*QUIET).getreports("pytest_runtest_logreport")
    passed = {report.head_line for report in reports if report.passed and report.when == "call"}
    failed = {report.head_line: str(report.longrepr) for report in reports if report.failed}
    assert passed == {"test_pure", "test_socketpair", "test_marked"}
    assert {name: call for name, call in CALLS.items() if call in failed.get(name, "")} == CALLS
    assert all("name the file *_integ.py" in why for why in failed.values())


def test_the_integration_tier_is_chosen_by_file_name_and_runs_last(tiers: pytest.Pytester) -> None:
    result = tiers.runpytest(*QUIET, "-m", "integration")
    result.assert_outcomes(passed=1, deselected=len(UNIT_TESTS.split("def test_")) - 1)
    everything = tiers.runpytest(*QUIET, "--collect-only", "-q")
    tests = [line for line in everything.outlines if "::" in line]
    assert tests[0] == "test_unit.py::test_pure"
    assert tests[-1] == "test_early_integ.py::test_marked"


def test_an_integration_mark_outside_an_integ_file_is_refused(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(test_hidden="import pytest\n\n@pytest.mark.integration\ndef test_x():\n    pass\n")
    result = pytester.runpytest(*QUIET)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_x is marked integration: name its file *_integ.py instead"])


def test_the_modules_started_first_exist() -> None:
    # A renamed module would drop out of the order silently: the run would end with it going alone.
    from tests.conftest import LONGEST_FIRST, TESTS_DIR

    missing = [module for module in LONGEST_FIRST if not (TESTS_DIR / module).is_file()]
    assert not missing, f"tests/conftest.py LONGEST_FIRST names modules that do not exist: {missing}"
