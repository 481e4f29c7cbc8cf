"""``psserver top`` live: under tmux as a person sees it, and against a token-protected server."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pstools.launcher import start_server
from pstools.warm_start import stop_process
from tests.integration.workers import train_command

# -- the live view, under tmux ----------------------------------------------------------

TMUX = shutil.which("tmux")


def _worker(address: str, name: str, slowdown: float, log: Path) -> subprocess.Popen[bytes]:
    command = train_command(address, name, 1_000_000, slowdown=slowdown, settings={"torch_threads": 1})
    return subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)


@pytest.fixture
def live_cluster(tmp_path: Path) -> Iterator[str]:
    server, address = start_server(tmp_path, "asgd", 0.05, ())
    workers = [
        _worker(address, "fast-worker", 1.0, tmp_path / "fast.log"),
        _worker(address, "slow-worker", 4.0, tmp_path / "slow.log"),
    ]
    try:
        yield address
    finally:
        for worker in workers:
            worker.kill()
            worker.wait()
        assert stop_process(server) == 0


@pytest.fixture
def tmux_session() -> Iterator[str]:
    if TMUX is None:
        pytest.skip("tmux is not installed (make test installs it: apt-get install tmux)")
    name = f"hetps-top-{int(time.time() * 1000)}"
    subprocess.run(
        [TMUX, "new-session", "-d", "-s", name, "-x", "150", "-y", "40", "bash --norc --noprofile"], check=True
    )
    try:
        yield name
    finally:
        subprocess.run([TMUX, "kill-session", "-t", name])


def _capture(session: str) -> str:
    assert TMUX is not None
    return subprocess.run([TMUX, "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout


def _wait_for(session: str, ready: Callable[[str], bool], timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while True:
        text = _capture(session)
        if ready(text) or time.monotonic() > deadline:
            return text
        time.sleep(0.3)


def _row(text: str, name: str) -> list[str]:
    return next((line.split() for line in text.splitlines() if line.strip().startswith(name)), [])


def _speed_shown(text: str) -> bool:
    rows = [_row(text, "fast-worker"), _row(text, "slow-worker")]
    return all(len(row) > 3 and row[2] != "–" for row in rows)


def _clock(text: str) -> int:
    match = re.search(r"127\.0\.0\.1:\d+\s+asgd\s+(\d+)", text)
    assert match, text
    return int(match.group(1))


def test_top_under_tmux_refreshes_in_place_and_quits_on_ctrl_c(live_cluster: str, tmux_session: str) -> None:
    assert TMUX is not None
    command = f"{shlex.quote(sys.executable)} -m psserver top --server {live_cluster} --interval 0.5"
    subprocess.run([TMUX, "send-keys", "-t", tmux_session, f"{command}; echo top exited with $?", "Enter"], check=True)

    # Speed arrives with the workers' first heartbeats, 5 s into their training.
    first = _wait_for(tmux_session, _speed_shown, timeout_s=60)
    assert _speed_shown(first), first
    assert first.count("hetps top") == 1 and "Ctrl-C quits" in first
    assert "speed spread" in first and "waiting" not in first
    fast, slow = _row(first, "fast-worker"), _row(first, "slow-worker")
    # worker device samples/s step unit pushes push/s pulls τ-last τ-mean τ-max gap penalty seen
    assert float(fast[2].replace(",", "")) > 2 * float(slow[2].replace(",", "")), first
    assert float(slow[9]) > float(fast[9]), first  # the slower worker's pushes are staler
    assert fast[12] == slow[12] == "1.000"  # ASGD applies every push unscaled

    second = _wait_for(tmux_session, lambda text: _clock(text) > _clock(first), timeout_s=10)
    assert _clock(second) > _clock(first), second
    assert second.count("hetps top") == 1  # redrawn in place, not scrolled

    subprocess.run([TMUX, "send-keys", "-t", tmux_session, "C-c"], check=True)
    exited = re.compile(r"^top exited with (\d+)", re.MULTILINE)  # the output, not the command line
    after = _wait_for(tmux_session, lambda text: exited.search(text) is not None, timeout_s=10)
    match = exited.search(after)
    assert match and match.group(1) == "0", after
    assert "Traceback" not in after and "hetps top" not in after  # the terminal is given back as it was


# -- a server that requires a token --------------------------------------------------------

TOKEN = "top-test-token"


def _top_once(address: str, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "psserver", "top", "--server", address, "--once", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "150"})


@pytest.mark.integration
def test_top_watches_a_token_protected_server_with_the_token_and_says_why_not_without(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    server, address = start_server(tmp_path, "asgd", 0.05, (), extra_args=("--auth-token-file", str(token_file)))
    try:
        refused = _top_once(address)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "UNAUTHENTICATED: no bearer token was sent" in refused.stdout  # in the shards table
        assert f"no answer from {address}: UNAUTHENTICATED" in refused.stderr

        wrong_file = tmp_path / "wrong"
        wrong_file.write_text("not-the-token")
        wrong = _top_once(address, "--auth-token-file", str(wrong_file))
        assert wrong.returncode == 1 and "the bearer token is wrong" in wrong.stdout, wrong.stdout + wrong.stderr

        shown = _top_once(address, "--auth-token-file", str(token_file))
        assert shown.returncode == 0, shown.stdout + shown.stderr
        assert "UNAUTHENTICATED" not in shown.stdout
        assert re.search(rf"{re.escape(address)}\s+asgd\s+0\s", shown.stdout), shown.stdout  # address, rule, clock
        assert "unauthenticated 2" in shown.stdout  # the two refusals above, counted by the server

        missing = _top_once(address, "--auth-token-file", str(tmp_path / "absent"))
        assert missing.returncode == 2 and "--auth-token-file" in missing.stderr
    finally:
        assert stop_process(server) == 0
