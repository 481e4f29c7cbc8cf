"""The client's HTTP/2 keepalive and the server policy it pairs with."""

from __future__ import annotations

import pytest

from psserver.rpc.server import SERVER_MIN_PING_INTERVAL_S
from psworker.channels import DEFAULT_KEEPALIVE_S, MIN_KEEPALIVE_S, channel_options, check_keepalive


def test_a_silent_link_is_noticed_within_twice_the_keepalive_interval() -> None:
    options = dict(channel_options(4.0))
    assert options["grpc.keepalive_time_ms"] == 4000
    # The answer is awaited half an interval: ping after at most one interval of silence, closed
    # half an interval later, 1.5 intervals in all.
    assert options["grpc.keepalive_timeout_ms"] == options["grpc.http2.ping_timeout_ms"] == 2000
    assert options["grpc.keepalive_permit_without_calls"] == 1  # between calls too
    assert options["grpc.http2.max_pings_without_data"] == 0  # however long no data is sent
    assert options["grpc.use_local_subchannel_pool"] == 1  # a new channel is a new connection
    assert options["grpc.min_reconnect_backoff_ms"] == 8000  # a handshake gets two intervals
    assert dict(channel_options(MIN_KEEPALIVE_S))["grpc.min_reconnect_backoff_ms"] == 2000
    assert DEFAULT_KEEPALIVE_S >= MIN_KEEPALIVE_S


@pytest.mark.parametrize("seconds", [0.0, 0.5, 0.999, float("nan")])
def test_a_keepalive_the_server_would_punish_is_refused(seconds: float) -> None:
    with pytest.raises(ValueError, match="too_many_pings"):
        check_keepalive(seconds)


def test_the_server_accepts_pings_twice_as_often_as_the_fastest_client_sends_them() -> None:
    assert SERVER_MIN_PING_INTERVAL_S * 2 <= MIN_KEEPALIVE_S
