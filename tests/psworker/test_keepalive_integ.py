"""The client's HTTP/2 keepalive against the server's keepalive policy, over a real connection."""

from __future__ import annotations

import time

import grpc

from psproto.v1 import ps_pb2, ps_pb2_grpc
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psserver.rpc.server import start_server
from psworker.channels import MIN_KEEPALIVE_S, open_channel


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
        running.stop(0)
