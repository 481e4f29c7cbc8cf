"""A client's channel: closing it never waits for ever on a call its thread abandoned, and a Pull is
read on the thread that makes it."""

from __future__ import annotations

import threading
import time

import grpc
import pytest
import torch

from psproto.layout import Layout
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psworker.channels import SINGLE_THREADED_PULLS, channel_options, close_channel
from psworker.client import PSClient
from tests.psworker.live import serving


class _StuckChannel:
    """A channel whose close waits for a call nobody will take apart (one abandoned mid-call)."""

    def __init__(self) -> None:
        self.released = threading.Event()

    def close(self) -> None:
        self.released.wait()


def test_closing_a_channel_stuck_on_an_abandoned_call_gives_up_after_its_timeout() -> None:
    stuck = _StuckChannel()
    started = time.monotonic()
    assert close_channel(stuck, timeout=0.2) is False  # type: ignore[arg-type]
    assert 0.2 <= time.monotonic() - started < 2
    stuck.released.set()
    assert close_channel(grpc.insecure_channel("127.0.0.1:9"), timeout=5) is True


def test_a_pull_is_read_on_the_callers_thread_with_no_thread_of_grpcs_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    layout = Layout.from_named_shapes([("w", (30, 40)), ("b", (40,))])
    shard = Shard(ShardConfig(RuleSpec.parse("asgd", {"lr": "0.5"})))
    start = torch.linspace(-1, 1, layout.total_length)
    with serving(shard) as address:
        client = PSClient([address], layout, name="reader")
        try:
            assert client.init(start)
            started: list[str] = []
            thread_start = threading.Thread.start

            def noted_start(thread: threading.Thread) -> None:
                started.append(thread.name)
                thread_start(thread)

            monkeypatch.setattr(threading.Thread, "start", noted_start)
            out = torch.empty(layout.total_length)
            for _ in range(3):
                client.pull(out)
            monkeypatch.undo()
            assert torch.equal(out, start)
            # Without SingleThreadedUnaryStream gRPC starts a thread of its own to read each such call.
            assert started == []
        finally:
            client.close()


def test_the_channels_options_read_pulls_on_the_callers_thread() -> None:
    assert SINGLE_THREADED_PULLS in channel_options()
