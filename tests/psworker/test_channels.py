"""Closing a client's channel: never waits for ever on a call its thread abandoned."""

from __future__ import annotations

import threading
import time

import grpc

from psworker.channels import close_channel


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
