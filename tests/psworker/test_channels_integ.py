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
from psserver.rpc.server import RPC_THREAD_PREFIX
from psworker import channels
from psworker.channels import close_channel
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


def _threads_started_by_pulls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The client's threads started while it pulls a live shard three times (each pull checked);
    the in-process server's RPC handlers, which its pool starts as calls come, are not the client's."""
    layout = Layout.from_named_shapes([("w", (30, 40)), ("b", (40,))])
    shard = Shard(ShardConfig(RuleSpec.parse("asgd", {"lr": "0.5"})))
    start = torch.linspace(-1, 1, layout.total_length)
    started: list[str] = []
    with serving(shard) as address, PSClient([address], layout, name="reader") as client:
        assert client.init(start)
        thread_start = threading.Thread.start

        def noted_start(thread: threading.Thread) -> None:
            if not thread.name.startswith(RPC_THREAD_PREFIX):
                started.append(thread.name)
            thread_start(thread)

        with monkeypatch.context() as patched:
            patched.setattr(threading.Thread, "start", noted_start)
            out = torch.empty(layout.total_length)
            for _ in range(3):
                client.pull(out)
        assert torch.equal(out, start)
    return started


def test_a_small_shards_pull_is_read_on_the_callers_thread_with_no_thread_of_grpcs_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _threads_started_by_pulls(monkeypatch) == []


def test_a_large_shards_pull_keeps_grpcs_reading_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    # The shard's 1,240 fp32 parameters (4,960 bytes) over a bound lowered to 4 KiB: gRPC reads its pulls.
    monkeypatch.setattr(channels, "SINGLE_THREADED_PULL_BYTES", 4096)
    assert len(_threads_started_by_pulls(monkeypatch)) >= 3


def test_pulls_are_read_inline_up_to_the_bound_in_fp32() -> None:
    bound = channels.SINGLE_THREADED_PULL_BYTES // 4
    assert channels.single_threaded_pulls_pay([10, bound])
    assert not channels.single_threaded_pulls_pay([10, bound + 1])
    assert channels.SINGLE_THREADED_PULLS in channels.channel_options(single_threaded_pulls=True)
    # gRPC's own reader unless asked (a channel for Status calls only, such as `psserver top`'s).
    assert channels.SINGLE_THREADED_PULLS not in channels.channel_options()
