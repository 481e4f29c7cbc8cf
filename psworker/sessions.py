"""A client's standing with each shard: sessions, retry policy, clock bookkeeping, recovery decisions.

What to do about a failed call is decided here from the refusal's reason
(:func:`psproto.errors.reason_of`), never from its message text: a shard that no longer knows
the worker is joined again, a transient failure (no reason, a retryable code) is retried with
backoff, a name held by another joined worker is waited out on the first Join, and a base
clock from the future (the shard restarted behind the worker) is handled by the push path.
The decisions are pure functions of the error, so they are tested without a server.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import grpc

from psproto.errors import Reason, reason_of
from psproto.layout import ShardRange
from psproto.v1 import ps_pb2, ps_pb2_grpc
from psworker.transfer import DataPath

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    # Reconnect soon after a server restart or a dropped connection (gRPC's default starts at 1 s).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
]


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff for calls that failed because the server could not be reached."""

    # Give up when a call has been failing for this long (then the last error is raised).
    give_up_seconds: float = 300.0
    initial_backoff: float = 0.1
    max_backoff: float = 2.0
    multiplier: float = 2.0
    # Status codes that mean "try again" when the server gave no reason: it is down, restarting,
    # or the network dropped; CANCELLED: the transport cancelled the call. A retried push keeps
    # its push id, so it is applied once whatever the first attempt did.
    retry_codes: frozenset[grpc.StatusCode] = frozenset(
        {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
    )
    # Refusals worth sending again as they are: the server cancelled a push that stalled (a
    # paused process, a healed partition); the retry keeps its push id.
    retry_reasons: frozenset[Reason] = frozenset({Reason.PUSH_STALLED})


NO_RETRY = RetryPolicy(give_up_seconds=0.0)


class Recovery(enum.Enum):
    """What the client does about a failed call to a shard."""

    REJOIN = "rejoin"  # the shard no longer knows this worker: Join again with resume
    RETRY = "retry"  # transient: back off and send the same call again
    WAIT_FOR_NAME = "wait_for_name"  # first Join: another joined worker holds the name; retry without resume
    FAIL = "fail"  # nothing to do: the error goes to the caller


def recovery_for(error: grpc.RpcError, policy: RetryPolicy) -> Recovery:
    """The recovery for a failed call on a joined session."""
    reason = reason_of(error)
    if reason is Reason.UNKNOWN_WORKER:
        return Recovery.REJOIN
    if reason in policy.retry_reasons:
        return Recovery.RETRY
    if reason is None and error.code() in policy.retry_codes:
        return Recovery.RETRY
    return Recovery.FAIL


def join_recovery_for(error: grpc.RpcError, policy: RetryPolicy) -> Recovery:
    """The recovery for a failed first Join."""
    if reason_of(error) is Reason.NAME_IN_USE:
        return Recovery.WAIT_FOR_NAME
    recovery = recovery_for(error, policy)
    return Recovery.RETRY if recovery is Recovery.RETRY else Recovery.FAIL


def is_future_clock(error: grpc.RpcError) -> bool:
    """A push refused because its base clock is ahead of the shard's (the shard restarted behind)."""
    return reason_of(error) is Reason.FUTURE_CLOCK


@dataclass(frozen=True)
class Rollback:
    """A shard came back (restored from a checkpoint) at an earlier clock than this client had seen."""

    shard: int
    seen_clock: int
    clock: int

    @property
    def lost_updates(self) -> int:
        return self.seen_clock - self.clock


@dataclass
class ClientStats:
    retries: int = 0
    rejoins: int = 0
    duplicate_acks: int = 0
    rollbacks: list[Rollback] = field(default_factory=list)


class ServerMismatchError(RuntimeError):
    """The shards the client reached do not agree with the model it holds."""


@dataclass
class ShardSession:
    """This client joined to one shard: where, as which worker, and what the Join reply said."""

    address: str
    stub: ps_pb2_grpc.ParameterServerStub
    channel: grpc.Channel
    worker_id: int
    range: ShardRange
    join: ps_pb2.JoinResponse
    data: DataPath
