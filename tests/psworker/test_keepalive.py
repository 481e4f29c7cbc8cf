"""The client's HTTP/2 keepalive and the server policy it pairs with."""

from __future__ import annotations

import time

import grpc
import pytest

from psproto.v1 import ps_pb2, ps_pb2_grpc
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psserver.rpc.server import SERVER_MIN_PING_INTERVAL_S, start_server
from psworker.channels import DEFAULT_KEEPALIVE_S, MIN_KEEPALIVE_S, channel_options, check_keepalive, open_channel


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


def test_an_idle_connection_pinging_every_second_is_never_sent_away() -> None:
    """With gRPC's default server policy this connection got GOAWAY too_many_pings (went IDLE)
    about 3 s in; with the server's keepalive policy it stays READY."""
    running = start_server(Shard(ShardConfig(RuleSpec.parse("asgd", {"lr": "0.1"}))), "127.0.0.1:0")
    channel = open_channel(f"127.0.0.1:{running.port}", None, MIN_KEEPALIVE_S)
    states: list[grpc.ChannelConnectivity] = []
    try:
        ps_pb2_grpc.ParameterServerStub(channel).Status(ps_pb2.StatusRequest(), timeout=5)
        channel.subscribe(states.append)
        time.sleep(4.5)  # four pings or more without a call or any data
        assert states and set(states) == {grpc.ChannelConnectivity.READY}, states
    finally:
        channel.close()
        running.server.stop(0).wait()
