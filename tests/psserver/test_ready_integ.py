"""The ready file a real ``psserver serve`` writes: what it says, that nobody sees half of it,
and that a server exiting before it is ready is an error, not a wait."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import grpc
import pytest

from psproto.v1 import ps_pb2, ps_pb2_grpc
from psserver.ready import READY_FORMAT, ReadyFileError, ReadyInfo, read_ready_file, wait_for_ready_file

SERVE = [sys.executable, "-m", "psserver", "serve", "--host", "127.0.0.1", "--port", "0"]


@contextmanager
def serving(ready_file: Path, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(
        [*SERVE, "--ready-file", str(ready_file), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_serving_server_says_where_it_listens_and_removes_the_file_when_it_drains(tmp_path: Path) -> None:
    ready_file = tmp_path / "ready.json"
    with serving(
        ready_file, "--rule", "momentum", "--shard-index", "1", "--num-shards", "2", "--metrics-port", "0"
    ) as p:
        info = wait_for_ready_file(ready_file, p)
        assert info.pid == p.pid
        assert (info.host, info.shard_index, info.num_shards, info.rule, info.clock) == (
            "127.0.0.1",
            1,
            2,
            "momentum",
            0,
        )
        assert info.port > 0 and info.metrics_port is not None and info.metrics_port > 0
        assert info.format == READY_FORMAT
        with grpc.insecure_channel(info.address) as channel:
            status = ps_pb2_grpc.ParameterServerStub(channel).Status(ps_pb2.StatusRequest(), timeout=10)
        assert (status.shard_index, status.num_shards, status.rule.name) == (1, 2, "momentum")
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0
    assert not ready_file.exists()
    assert list(tmp_path.iterdir()) == [], "the temporary file was left behind"


def test_a_server_without_metrics_writes_none_for_the_metrics_port(tmp_path: Path) -> None:
    ready_file = tmp_path / "ready.json"
    with serving(ready_file, "--metrics-port", "off") as process:
        assert wait_for_ready_file(ready_file, process).metrics_port is None
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0


def test_a_reader_never_sees_a_partial_file(tmp_path: Path) -> None:
    ready_file = tmp_path / "ready.json"
    seen: list[str] = []
    done = threading.Event()

    def read_until_done() -> None:
        # Reads as fast as it can from before the server starts until after it wrote the file.
        while not done.is_set():
            with suppress(FileNotFoundError):
                seen.append(ready_file.read_text())

    reader = threading.Thread(target=read_until_done)
    reader.start()
    try:
        with serving(ready_file, "--metrics-port", "off") as process:
            info = wait_for_ready_file(ready_file, process)
            for _ in range(20):
                seen.append(ready_file.read_text())
            process.send_signal(signal.SIGTERM)
            assert process.wait(30) == 0
    finally:
        done.set()
        reader.join()
    assert seen
    for text in seen:
        assert ReadyInfo(**json.loads(text)) == info


def test_a_server_that_exits_before_it_is_ready_is_an_error(tmp_path: Path) -> None:
    ready_file = tmp_path / "ready.json"
    with (
        serving(ready_file, "--rule", "no-such-rule") as process,
        pytest.raises(ReadyFileError, match="exited with code 2 before it was ready"),
    ):
        wait_for_ready_file(ready_file, process, timeout_s=60)
    assert not ready_file.exists()


def test_waiting_runs_out_and_other_formats_are_refused(tmp_path: Path) -> None:
    ready_file = tmp_path / "ready.json"
    with pytest.raises(ReadyFileError, match="no ready file"):
        wait_for_ready_file(ready_file, timeout_s=0.1)
    ready_file.write_text(json.dumps({"format": READY_FORMAT + 1, "port": 1}))
    with pytest.raises(ReadyFileError, match="format"):
        read_ready_file(ready_file)
