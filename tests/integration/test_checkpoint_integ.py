"""The Checkpoint RPC and `psserver checkpoint` against a real server: a file on disk at the server's clock,
or CHECKPOINT_FAILED when it cannot be written."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest
import torch

from psproto import codec
from psproto.errors import reason_of
from psproto.layout import Layout
from psproto.reasons import Reason
from psproto.v1 import ps_pb2, ps_pb2_grpc
from psserver.core.checkpoint import list_checkpoints, read_checkpoint
from tests.integration.conftest import StartServer

pytestmark = pytest.mark.integration
LAYOUT = Layout.from_named_shapes([("w", (16,))])


def _join_and_init(stub: ps_pb2_grpc.ParameterServerStub) -> int:
    request = ps_pb2.JoinRequest(worker_name="w", layout=LAYOUT.to_proto(), layout_hash=LAYOUT.hash)
    worker_id = int(stub.Join(request, timeout=10).worker_id)
    header = ps_pb2.InitHeader(worker_id=worker_id, layout_hash=LAYOUT.hash)
    init = [ps_pb2.InitRequest(header=header), *(ps_pb2.InitRequest(chunk=c) for c in codec.encode(torch.zeros(16)))]
    stub.Init(iter(init), timeout=10)
    return worker_id


def _push(stub: ps_pb2_grpc.ParameterServerStub, worker_id: int, push_id: int, base_clock: int) -> int:
    header = ps_pb2.PushHeader(
        worker_id=worker_id,
        push_id=push_id,
        base_clock=base_clock,
        kind=ps_pb2.PAYLOAD_KIND_GRADIENT,
        layout_hash=LAYOUT.hash,
    )
    chunks = (ps_pb2.PushRequest(chunk=c) for c in codec.encode(torch.ones(16)))
    return int(stub.Push(iter([ps_pb2.PushRequest(header=header), *chunks]), timeout=10).clock)


def test_the_checkpoint_rpc_and_command_write_a_file_at_the_servers_clock(
    tmp_path: Path,
    start_psserver: StartServer,
    stub_for: Callable[[str], ps_pb2_grpc.ParameterServerStub],
) -> None:
    directory = tmp_path / "checkpoints"
    address = start_psserver("asgd", lr=0.5, extra_args=["--checkpoint-dir", str(directory)])
    stub = stub_for(address)
    worker_id = _join_and_init(stub)
    for push_id in range(1, 4):
        _push(stub, worker_id, push_id, push_id - 1)

    reply = stub.Checkpoint(ps_pb2.CheckpointRequest(), timeout=30)
    status = stub.Status(ps_pb2.StatusRequest(), timeout=10)
    path = Path(reply.path)
    assert path.is_file() and path.parent == directory
    assert reply.clock == status.clock == 3
    assert [(clock, p) for _, clock, p in list_checkpoints(directory)] == [(3, path)]
    saved = read_checkpoint(path)  # torch.load(weights_only=True)
    assert saved["clock"] == 3
    torch.testing.assert_close(saved["params"], torch.full((16,), -1.5))

    assert _push(stub, worker_id, 4, 3) == 4  # the command's checkpoint is of a later clock
    result = subprocess.run(
        [sys.executable, "-m", "psserver", "checkpoint", "--server", address, "--timeout", "30"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    match = re.fullmatch(r"(\S+) clock=(\d+)\n", result.stdout)
    assert match, result.stdout
    written = Path(match.group(1))
    assert written.is_file() and written != path
    assert int(match.group(2)) == stub.Status(ps_pb2.StatusRequest(), timeout=10).clock == 4
    assert read_checkpoint(written)["clock"] == 4
    assert [clock for _, clock, _ in list_checkpoints(directory)] == [3, 4]


def test_a_checkpoint_rpc_into_a_file_is_checkpoint_failed_not_unknown(
    tmp_path: Path,
    start_psserver: StartServer,
    stub_for: Callable[[str], ps_pb2_grpc.ParameterServerStub],
) -> None:
    directory = tmp_path / "checkpoints"
    address = start_psserver("asgd", lr=0.5, extra_args=["--checkpoint-dir", str(directory)])
    assert directory.is_dir()  # made on start: a folder that cannot be made fails the start instead
    directory.rmdir()
    directory.write_text("a file where the checkpoint folder was")
    with pytest.raises(grpc.RpcError) as caught:
        stub_for(address).Checkpoint(ps_pb2.CheckpointRequest(), timeout=30)
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert reason_of(caught.value) is Reason.CHECKPOINT_FAILED
    assert str(directory) in (caught.value.details() or "")
