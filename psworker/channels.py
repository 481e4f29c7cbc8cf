"""How the client connects to a shard: the gRPC channel and its HTTP/2 keepalive.

A link that stops delivering packets without closing (a host that died, a partition) sends no
RST and no FIN, so TCP alone notices nothing for many minutes. The client therefore pings the
server over HTTP/2: after ``keepalive_seconds`` without receiving anything it sends a PING and
gives the server half that long to answer; without an answer the transport is closed and every
call on it fails with UNAVAILABLE at once. A silent link is so noticed within
``1.5 * keepalive_seconds`` of its last delivered byte, less than twice the interval.

The server must accept pings this often or it answers GOAWAY "too_many_pings" (and gRPC then
doubles the client's interval, silently): ``psserver.rpc.server.KEEPALIVE_SERVER_OPTIONS``
accepts one every ``SERVER_MIN_PING_INTERVAL_S`` (0.5 s), with or without calls, so any
interval from :data:`MIN_KEEPALIVE_S` (1 s) up pairs with it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Sequence

import grpc
from grpc.experimental import ChannelOptions

from psproto import codec

# Pings every 10 s: a dead link is noticed within 15 s; on a live one a ping costs 17 bytes.
DEFAULT_KEEPALIVE_S = 10.0
# Twice the server's accepted ping interval, so timer jitter never counts as a ping too many.
MIN_KEEPALIVE_S = 1.0
MAX_MESSAGE_BYTES = codec.DEFAULT_MAX_MESSAGE_BYTES
# gRPC's option that reads a unary-stream call (Pull) on the thread that iterates it. Without it the
# synchronous client starts a thread per call on an idle channel to read the call's events, and hands
# each message over. That costs a small pull 5-15% (benchmarks/call_forms.py). From about 16 MB the
# two are level, and at 47 MB the thread, reading ahead while the caller decodes, was a few percent
# faster, so larger shards keep it.
SINGLE_THREADED_PULLS = (ChannelOptions.SingleThreadedUnaryStream, 1)
SINGLE_THREADED_PULL_BYTES = 8 << 20
# How long closing a channel may take before it is left to the process's exit.
CLOSE_TIMEOUT_S = 5.0
_LOGGER = logging.getLogger(__name__)


def check_keepalive(keepalive_seconds: float) -> None:
    """Refuse an interval the server's ping policy would punish."""
    if not keepalive_seconds >= MIN_KEEPALIVE_S:
        raise ValueError(
            f"a keepalive interval of {keepalive_seconds} s is below {MIN_KEEPALIVE_S} s: the server answers more "
            "frequent pings with GOAWAY too_many_pings"
        )


# Separates the replicas of one shard in a server entry: ``HOST:PORT|HOST:PORT``.
REPLICA_SEPARATOR = "|"


def replica_sets(servers: str | Sequence[str]) -> list[tuple[str, ...]]:
    """Each server entry's replica set, in the entries' order; a ValueError names what is wrong.

    An entry is one shard: its address, or its replicas' addresses joined by ``|`` (a primary and
    its backups, in any order: the client finds the primary). No address may appear twice."""
    entries = [servers] if isinstance(servers, str) else list(servers)
    sets = [tuple(member.strip() for member in entry.split(REPLICA_SEPARATOR)) for entry in entries]
    for entry, replicas in zip(entries, sets, strict=True):
        if "" in replicas:
            raise ValueError(
                f"server entry {entry!r} has an empty address; give HOST:PORT, or a shard's replicas as "
                f"HOST:PORT{REPLICA_SEPARATOR}HOST:PORT"
            )
    addresses = [address for replicas in sets for address in replicas]
    repeated = sorted({a for a in addresses if addresses.count(a) > 1})
    if repeated:
        raise ValueError(
            f"server address(es) {', '.join(repeated)} listed more than once; give each shard's address once, "
            "in shard order, and each replica in one set only"
        )
    return sets


def shard_addresses(servers: str | Sequence[str], num_shards: int) -> list[tuple[str, ...]]:
    """The replica set of each of ``num_shards`` shards, in shard order (:func:`replica_sets`)."""
    sets = replica_sets(servers)
    if len(sets) != num_shards:
        raise ValueError(f"{len(sets)} server address(es) for a layout of {num_shards} shard(s)")
    return sets


def single_threaded_pulls_pay(shard_lengths: Iterable[int]) -> bool:
    """Whether pulls of shards of these lengths are better read on the caller's thread: each at most
    :data:`SINGLE_THREADED_PULL_BYTES` in fp32, the largest pull dtype."""
    return codec.wire_bytes(max(shard_lengths, default=0), codec.FLOAT32) <= SINGLE_THREADED_PULL_BYTES


def channel_options(
    keepalive_seconds: float = DEFAULT_KEEPALIVE_S, single_threaded_pulls: bool = False
) -> list[tuple[str, int]]:
    """The client's channel options: message limits, reconnection, keepalive, and with
    ``single_threaded_pulls`` pulls read on the caller's thread."""
    check_keepalive(keepalive_seconds)
    interval_ms = round(keepalive_seconds * 1000)
    answer_ms = interval_ms // 2
    return [
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        # Reconnect soon after a server restart or a dropped connection (gRPC's default starts at 1 s).
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 2000),
        # gRPC reads this as the least time a connection attempt gets to finish its handshake (TCP,
        # TLS, the server's SETTINGS): as long as a ping gets, twice over, so a slow link still connects
        # and one that swallows the handshake is given up as soon as an established one would be.
        ("grpc.min_reconnect_backoff_ms", max(1000, 2 * interval_ms)),
        ("grpc.keepalive_time_ms", interval_ms),
        ("grpc.keepalive_timeout_ms", answer_ms),
        # grpcio (1.85 at least) times a keepalive ping out after this (default 60 s), whatever
        # keepalive_timeout_ms says: without it a silent link went unnoticed for a minute.
        ("grpc.http2.ping_timeout_ms", answer_ms),
        # Between calls too (a worker computing a step), and with no cap on pings while no data is sent.
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # A channel of its own: a new channel after a dead one must open a new connection, never
        # share the dead one through gRPC's process-wide subchannel pool.
        ("grpc.use_local_subchannel_pool", 1),
        *([SINGLE_THREADED_PULLS] if single_threaded_pulls else []),
    ]


def open_channel(
    address: str,
    credentials: grpc.ChannelCredentials | None,
    keepalive_seconds: float = DEFAULT_KEEPALIVE_S,
    single_threaded_pulls: bool = False,
) -> grpc.Channel:
    """A new channel (so a new connection) to ``address``, TLS when ``credentials`` are given
    (``single_threaded_pulls``: :func:`channel_options`)."""
    options = channel_options(keepalive_seconds, single_threaded_pulls)
    if credentials is not None:
        return grpc.secure_channel(address, credentials, options=options)
    return grpc.insecure_channel(address, options=options)


def close_channel(channel: grpc.Channel, timeout: float = CLOSE_TIMEOUT_S) -> bool:
    """Close ``channel``, waiting at most ``timeout`` seconds; whether it closed in that time.

    gRPC's ``Channel.close`` waits until every call on the channel has been taken apart by the
    thread that made it. A blocking call that thread left by an exception raised in the middle of
    it (SIGTERM's SystemExit, Ctrl-C) is never taken apart, and the close would wait for ever: a
    worker stopped with SIGTERM then never exited. The close runs on a daemon thread instead, so
    such a channel is left to the process's exit."""
    closer = threading.Thread(target=channel.close, name="channel-close", daemon=True)
    closer.start()
    closer.join(timeout)
    if closer.is_alive():
        _LOGGER.warning("a channel did not close within %.0f s (a call on it was abandoned); leaving it", timeout)
        return False
    return True
