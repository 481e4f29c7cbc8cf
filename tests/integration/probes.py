"""What the integration tests ask of a running shard while they wait on it: its Status, a condition."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import grpc

from psproto.v1 import ps_pb2, ps_pb2_grpc

T = TypeVar("T")


def status(address: str) -> ps_pb2.StatusResponse:
    """The shard's Status over a fresh insecure channel."""
    with grpc.insecure_channel(address) as channel:
        reply: ps_pb2.StatusResponse = ps_pb2_grpc.ParameterServerStub(channel).Status(
            ps_pb2.StatusRequest(), timeout=10
        )
        return reply


def wait_for(condition: Callable[[], T], timeout_s: float, what: str, poll_s: float = 0.05) -> T:
    """Poll ``condition`` until it returns something true, and return that; fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)
