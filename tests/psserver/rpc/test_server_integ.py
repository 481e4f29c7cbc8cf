"""The server's transport limits, over real sockets on 127.0.0.1."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from psserver.rpc.server import (
    DEFAULT_RECEIVE_WINDOW_BYTES,
    MAX_RECEIVE_WINDOW_BYTES,
    MIN_RECEIVE_WINDOW_BYTES,
    ServerLimits,
)

CHUNK = 16 * 1024


def _bytes_sent_to_a_stream_nobody_reads(limits: ServerLimits) -> int:
    """How far a client gets streaming into a handler that has not started reading yet."""
    release = threading.Event()

    def handler(requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
        release.wait(30)
        return str(sum(len(r) for r in requests)).encode()

    identity = {"request_deserializer": None, "response_serializer": None}
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=limits.channel_options())
    methods = {"Stream": grpc.stream_unary_rpc_method_handler(handler, **identity)}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Window", methods),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    sent = 0
    total = 64 * 1024 * 1024

    def requests() -> Iterator[bytes]:
        nonlocal sent
        for _ in range(total // CHUNK):
            sent += CHUNK
            yield bytes(CHUNK)

    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.stream_unary("/test.Window/Stream", None, None).future(requests(), timeout=60)
            # Until the client stops getting further: the window is full.
            last, still_since = -1, time.monotonic()
            while time.monotonic() - still_since < 1.0:
                if sent != last:
                    last, still_since = sent, time.monotonic()
                time.sleep(0.05)
            held = sent
            release.set()
            assert call.result() == str(total).encode()  # everything arrives once the handler reads
    finally:
        release.set()
        server.stop(0).wait()
    return held


@pytest.mark.parametrize("window", [MIN_RECEIVE_WINDOW_BYTES, 1024 * 1024])
def test_a_stream_nobody_reads_yet_holds_at_most_the_receive_window(window: int) -> None:
    held = _bytes_sent_to_a_stream_nobody_reads(ServerLimits(receive_window_bytes=window))
    # The message the client was writing when the window closed may count, nothing more.
    assert window // 2 <= held <= window + CHUNK


def test_the_window_is_fixed_unless_auto() -> None:
    fixed = dict(ServerLimits().channel_options())
    assert fixed["grpc.http2.bdp_probe"] == 0
    assert fixed["grpc.http2.lookahead_bytes"] == DEFAULT_RECEIVE_WINDOW_BYTES
    # Frames as large as the window, within HTTP/2's largest.
    assert fixed["grpc.http2.max_frame_size"] == DEFAULT_RECEIVE_WINDOW_BYTES
    huge = dict(ServerLimits(receive_window_bytes=MAX_RECEIVE_WINDOW_BYTES).channel_options())
    assert huge["grpc.http2.max_frame_size"] == 2**24 - 1
    probing = dict(ServerLimits(receive_window_bytes=None).channel_options())
    assert not {"grpc.http2.bdp_probe", "grpc.http2.lookahead_bytes", "grpc.http2.max_frame_size"} & set(probing)


@pytest.mark.parametrize("window", [0, MIN_RECEIVE_WINDOW_BYTES - 1, MAX_RECEIVE_WINDOW_BYTES + 1])
def test_a_receive_window_out_of_range_is_refused(window: int) -> None:
    with pytest.raises(ValueError, match="receive_window_bytes"):
        ServerLimits(receive_window_bytes=window)
