"""A checkpoint altered in place on disk, against real processes: the server restores the one
before it and says so, ``psserver checkpoints`` flags it (exit 1), ``psworker export`` refuses it."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch

from psproto import codec
from psproto.layout import Layout
from psproto.v1 import ps_pb2, ps_pb2_grpc
from psserver.core.checkpoint import list_checkpoints, read_checkpoint
from pstools.launcher import start_server
from pstools.warm_start import stop_process

pytestmark = pytest.mark.integration
LAYOUT = Layout.from_named_shapes([("w", (64,))])
EVERY = 3


@pytest.fixture
def servers() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        stop_process(process)


def _push(stub: ps_pb2_grpc.ParameterServerStub, worker_id: int, push_id: int, base_clock: int) -> int:
    header = ps_pb2.PushHeader(
        worker_id=worker_id,
        push_id=push_id,
        base_clock=base_clock,
        kind=ps_pb2.PAYLOAD_KIND_GRADIENT,
        layout_hash=LAYOUT.hash,
    )
    body = [ps_pb2.PushRequest(header=header), *(ps_pb2.PushRequest(chunk=c) for c in codec.encode(torch.ones(64)))]
    return int(stub.Push(iter(body), timeout=10).clock)


def _join_and_init(stub: ps_pb2_grpc.ParameterServerStub) -> int:
    request = ps_pb2.JoinRequest(worker_name="w", layout=LAYOUT.to_proto(), layout_hash=LAYOUT.hash)
    worker_id = int(stub.Join(request, timeout=10).worker_id)
    header = ps_pb2.InitHeader(worker_id=worker_id, layout_hash=LAYOUT.hash)
    chunks = codec.encode(torch.zeros(64))
    stub.Init(iter([ps_pb2.InitRequest(header=header), *(ps_pb2.InitRequest(chunk=c) for c in chunks)]), timeout=10)
    return worker_id


def _clock(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        return int(ps_pb2_grpc.ParameterServerStub(channel).Status(ps_pb2.StatusRequest(), timeout=10).clock)


def _alter_in_place(path: Path, count: int = 40) -> None:
    """Flip ``count`` bytes in the middle of ``path`` without changing its length (bit rot)."""
    size = path.stat().st_size
    with path.open("r+b") as stream:
        stream.seek(size // 2)
        original = stream.read(count)
        stream.seek(size // 2)
        stream.write(bytes(b ^ 0xFF for b in original))
    assert path.stat().st_size == size


def test_a_checkpoint_altered_in_place_is_skipped_listed_and_refused(
    tmp_path: Path, servers: list[subprocess.Popen[str]]
) -> None:
    directory = tmp_path / "ckpt"
    args = ["--checkpoint-dir", str(directory), "--checkpoint-every", str(EVERY)]
    server, address = start_server(tmp_path, "asgd", 0.5, (), extra_args=args)
    servers.append(server)
    with grpc.insecure_channel(address) as channel:
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        worker_id = _join_and_init(stub)
        for push_id in range(1, EVERY + 1):
            _push(stub, worker_id, push_id, push_id - 1)
        deadline = time.monotonic() + 20
        while [clock for _, clock, _ in list_checkpoints(directory)] != [EVERY]:
            assert time.monotonic() < deadline, f"no checkpoint at clock {EVERY} within 20 s"
            time.sleep(0.05)
        good = list_checkpoints(directory)[-1][2]
        for push_id in (EVERY + 1, EVERY + 2):
            _push(stub, worker_id, push_id, push_id - 1)
    assert stop_process(server) == 0  # writes the final checkpoint, at clock 5
    assert [clock for _, clock, _ in list_checkpoints(directory)] == [3, 5]
    damaged = list_checkpoints(directory)[-1][2]
    good_params = read_checkpoint(good)["params"]
    _alter_in_place(damaged)

    restarted, again = start_server(tmp_path, "asgd", 0.5, (), extra_args=args, log_name="restarted.log")
    servers.append(restarted)
    # Started together: the listing and the export need no server, and each pays Python's start-up.
    listing = subprocess.Popen(
        [sys.executable, "-m", "psserver", "checkpoints", str(directory), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    export = subprocess.Popen(
        [sys.executable, "-m", "psworker", "export", "--checkpoint", str(damaged), "--out", str(tmp_path / "m.pt")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    listed, _ = listing.communicate(timeout=60)
    _, exported_err = export.communicate(timeout=60)

    assert _clock(again) == EVERY  # the previous good checkpoint, not the altered newest one
    log = (tmp_path / "restarted.log").read_text()
    assert f"skipping damaged checkpoint {damaged} (checksum mismatch" in log
    assert f"restored checkpoint {good}: clock {EVERY}" in log
    assert stop_process(restarted) == 0
    restored_final = read_checkpoint(list_checkpoints(directory)[-1][2])
    assert restored_final["clock"] == EVERY and torch.equal(restored_final["params"], good_params)

    assert listing.returncode == 1, listed
    rows = {c["path"]: c for c in json.loads(listed)["checkpoints"]}
    assert rows[str(damaged)]["status"] == "damaged" and rows[str(damaged)]["problem"].startswith("checksum mismatch")
    assert rows[str(good)]["status"] == "ok"

    assert export.returncode == 2
    assert f"{damaged} is damaged (checksum mismatch" in exported_err
    assert not (tmp_path / "m.pt").exists()
