"""A client's standing with each shard: sessions, retry policy, clock bookkeeping, recovery decisions.

What to do about a failed call is decided here from the refusal's reason
(:func:`psproto.errors.reason_of`), never from its message text: a shard that no longer knows
the worker is joined again, a call that got no answer (UNAVAILABLE or DEADLINE_EXCEEDED without
a reason: the server is down, or the link went silent and the keepalive or the deadline gave
up on it) is sent again on a new connection, other transient failures are retried on the same
one, a name held by another joined worker is waited out on the first Join, and a base clock
from the future (the shard restarted behind the worker) is handled by the push path.

A shard may be a replica set (a primary and its backups, :func:`psworker.channels.replica_sets`).
A replica that is not the primary refuses with NOT_PRIMARY and names the primary: the call
follows it there (or, while an election runs and none is named, to the next replica of the set).
A call that got no answer from a replica of a set of several goes to the next replica rather than
to the same address again. The new primary holds this worker's record and its push-id memory, so
the same call is sent again as it was (a push keeps its push id and is applied once).

The decisions are pure functions of the error, so they are tested without a server.
"""

from __future__ import annotations

import contextlib
import enum
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import grpc

from psproto.errors import Reason, error_info, limit_of, reason_of
from psproto.layout import ShardRange
from psproto.reasons import PRIMARY_KEY, TransientLimit
from psproto.v1 import ps_pb2, ps_pb2_grpc
from psworker.service import ServerMismatchError
from psworker.transfer import DataPath


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff for calls that failed because the server could not be reached."""

    # Give up when a call has kept failing for this long since its first failure (then the last
    # error is raised); time a call spends on a working exchange is not counted.
    give_up_seconds: float = 300.0
    initial_backoff: float = 0.1
    max_backoff: float = 2.0
    multiplier: float = 2.0
    # Status codes that mean "no answer" when the server gave no reason: it is down or restarting,
    # the connection broke, or the link went silent (the keepalive closed it, or the deadline ran
    # out). The call is sent again on a new connection. A retried push keeps its push id, so it is
    # applied once whatever the first attempt did.
    reconnect_codes: frozenset[grpc.StatusCode] = frozenset(
        {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
    )
    # Status codes worth sending again on the same connection when no reason is given: CANCELLED,
    # the call was cancelled under it (its connection was replaced by another call's retry).
    retry_codes: frozenset[grpc.StatusCode] = frozenset({grpc.StatusCode.CANCELLED})
    # Refusals worth sending again as they are: the server cancelled a push that stalled (a
    # paused process, a healed partition), or it is draining before a restart; a retried push
    # keeps its push id.
    retry_reasons: frozenset[Reason] = frozenset({Reason.PUSH_STALLED, Reason.DRAINING})
    # LIMIT_REACHED refusals worth sending again, by the limit they name: every receive buffer
    # was taken for the server's wait (other workers' pushes are being received), or this worker
    # still had pushes being received (an earlier attempt not yet ended). Both pass on their own;
    # the other limits (workers, parameters) do not, and fail the call.
    retry_limits: frozenset[str] = frozenset(limit.value for limit in TransientLimit)


NO_RETRY = RetryPolicy(give_up_seconds=0.0)
# The pause before a call goes to another replica of its shard (the primary a refusal named, or
# the next replica): fixed, not the growing backoff, so a failover costs the worker no more than
# the election. Short enough to add nothing visible, long enough that a set whose replicas point at
# each other during an election is not asked in a tight loop.
FOLLOW_PAUSE_S = 0.1
# Leaving is a courtesy (a lease ends a record anyway): a dead server must not hold the exit up long.
LEAVE_TIMEOUT_S = 5.0


class Recovery(enum.Enum):
    """What the client does about a failed call to a shard."""

    REJOIN = "rejoin"  # the shard no longer knows this worker: Join again with resume
    RECONNECT = "reconnect"  # no answer: replace the connection (the next replica of a set), send the same call again
    FOLLOW = "follow"  # not the primary: send the same call to the primary it names (or the next replica)
    RETRY = "retry"  # transient: back off and send the same call again
    WAIT_FOR_NAME = "wait_for_name"  # first Join: another joined worker holds the name; retry without resume
    FAIL = "fail"  # nothing to do: the error goes to the caller


# Refusals whose reason alone decides, whatever the policy.
_BY_REASON = {Reason.UNKNOWN_WORKER: Recovery.REJOIN, Reason.NOT_PRIMARY: Recovery.FOLLOW}


def recovery_for(error: grpc.RpcError, policy: RetryPolicy) -> Recovery:
    """The recovery for a failed call on a joined session."""
    reason = reason_of(error)
    if reason in _BY_REASON:
        return _BY_REASON[reason]
    if reason in policy.retry_reasons:
        return Recovery.RETRY
    if reason is Reason.LIMIT_REACHED and limit_of(error) in policy.retry_limits:
        return Recovery.RETRY
    if reason is None and error.code() in policy.reconnect_codes:
        return Recovery.RECONNECT
    if reason is None and error.code() in policy.retry_codes:
        return Recovery.RETRY
    return Recovery.FAIL


def join_recovery_for(error: grpc.RpcError, policy: RetryPolicy) -> Recovery:
    """The recovery for a failed first Join."""
    if reason_of(error) is Reason.NAME_IN_USE:
        return Recovery.WAIT_FOR_NAME
    recovery = recovery_for(error, policy)
    return recovery if recovery in RESEND else Recovery.FAIL


# The recoveries that send the same call again (to the same replica or another one of its set).
RESEND = frozenset({Recovery.RETRY, Recovery.RECONNECT, Recovery.FOLLOW})


def next_replica(replicas: Sequence[str], current: str) -> str:
    """The replica after ``current`` in its set, round the end; the first when ``current`` is not in
    the set (a primary a refusal named by another address)."""
    if current not in replicas:
        return replicas[0]
    return replicas[(replicas.index(current) + 1) % len(replicas)]


def next_address(recovery: Recovery, error: grpc.RpcError, replicas: Sequence[str], current: str) -> str:
    """Where a call that failed with ``error`` on ``current`` goes next, for ``recovery``.

    FOLLOW: the primary the refusal names; the next replica when it names none (an election is
    running) or names the replica that refused. RECONNECT: the next replica of a set of several,
    since a replica that gave no answer is likely down; the same address for a single server. Any
    other recovery stays where it is."""
    if recovery is Recovery.FOLLOW:
        info = error_info(error)
        primary = "" if info is None else info.metadata.get(PRIMARY_KEY, "").strip()
        return primary if primary and primary != current else next_replica(replicas, current)
    if recovery is Recovery.RECONNECT and len(replicas) > 1:
        return next_replica(replicas, current)
    return current


def quick_pause(recovery: Recovery, unanswered: int, set_size: int) -> float | None:
    """The fixed pause before a call is sent to another replica, or None for the growing backoff.

    ``unanswered``: the calls in a row, this one included, that got no answer. A call followed to
    the primary goes after :data:`FOLLOW_PAUSE_S`; so does one that got no answer from a replica of
    a set of several, until every replica has been tried without an answer: a whole set down is
    backed off from as a single server is."""
    if recovery is Recovery.FOLLOW or (recovery is Recovery.RECONNECT and unanswered < set_size):
        return FOLLOW_PAUSE_S
    return None


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

    def __str__(self) -> str:
        return (
            f"shard {self.shard} is back at clock {self.clock} after {self.seen_clock}: "
            f"{self.lost_updates} update(s) were lost"
        )


@dataclass
class ClientStats:
    retries: int = 0
    rejoins: int = 0
    # Connections replaced after a call got no answer (a silent link, a server down).
    reconnects: int = 0
    # Calls sent to another replica of their shard's set: the primary a refusal named, or the next
    # replica after NOT_PRIMARY without a name or no answer.
    follows: int = 0
    duplicate_acks: int = 0
    rollbacks: list[Rollback] = field(default_factory=list)


def observe_clock(seen_clocks: list[int], index: int, clock: int, seen_when_sent: int | None = None) -> Rollback | None:
    """Shard ``index`` showed ``clock`` (pulled, joined at, heartbeat): raise ``seen_clocks``; when it is
    below the highest seen, the rollback, and ``seen_clocks`` starts again from it.

    ``seen_when_sent``: the highest clock seen when the call that showed ``clock`` was sent. A reply
    that crossed a newer one (a heartbeat answered before a push of another thread was applied,
    read after its acknowledgement) shows a clock between the two: that is no rollback, and the
    newer clock is kept."""
    seen = seen_clocks[index]
    floor = seen if seen_when_sent is None else min(seen, seen_when_sent)
    if clock >= floor:
        seen_clocks[index] = max(seen, clock)
        return None
    seen_clocks[index] = clock
    return Rollback(index, seen, clock)


def pulled_shard_clock(version_clock: int, shard_clock: int | None, ack_clock: int | None = None) -> int:
    """The shard's clock that a pull reply shows, to be checked for a rollback (``observe_clock``).

    The parameters may be an older version the shard still sends to other workers (``--pull-versions``),
    so their ``version_clock`` is not the shard's. The server says its own, ``shard_clock``, with the
    reply; without it (an older server) the best known is the version's clock, or PushPull's
    acknowledgement (``ack_clock``: the shard's clock after the push, from the same process) if higher."""
    if shard_clock is not None:
        return shard_clock
    return version_clock if ack_clock is None else max(version_clock, ack_clock)


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

    def on_channel(self, channel: grpc.Channel, address: str) -> ShardSession:
        """The same standing with the shard (worker id, Join reply) over another connection, to
        ``address``: the same server, or another replica of its set (which holds the same records)."""
        stub = ps_pb2_grpc.ParameterServerStub(channel)
        return ShardSession(address, stub, channel, self.worker_id, self.range, self.join, DataPath(channel))


def reconnect_note(
    shard: int,
    old: str,
    new: str,
    error: grpc.RpcError,
    call_seconds: float,
    failing_seconds: float,
    budget_seconds: float,
) -> str:
    """The log line of a replaced connection: which shard, where from and to, why, after how long,
    and for how long more."""
    reason = reason_of(error)
    why = f"not the primary ({error.details()})" if reason is Reason.NOT_PRIMARY else "no answer"
    if reason is not Reason.NOT_PRIMARY:
        why += f" ({error.code().name}: {error.details()})"
    where = "opened a new connection" if new == old else f"switched to {new}"
    return (
        f"shard {shard} at {old}: {why} after {call_seconds:.1f} s; {where} (failing for {failing_seconds:.1f} s, "
        f"retrying for up to {budget_seconds:.0f} s)"
    )


def join_shard(
    channel: grpc.Channel,
    address: str,
    expected: ShardRange,
    request: ps_pb2.JoinRequest,
    timeout: float,
    metadata: tuple[tuple[str, str], ...],
    wait_for_ready: bool = True,
) -> ShardSession:
    """Join the shard at ``address`` over ``channel``; with ``wait_for_ready``, waiting for it to
    come up until ``timeout`` (a replica of a set does not wait: another one may be up).

    A server that serves another slice than ``expected`` is left again and refused with
    ServerMismatchError (its channel closed): the servers were listed out of shard order."""
    stub = ps_pb2_grpc.ParameterServerStub(channel)
    reply: ps_pb2.JoinResponse = stub.Join(request, timeout=timeout, wait_for_ready=wait_for_ready, metadata=metadata)
    index = expected.index
    if reply.shard_index != index or (reply.shard_offset, reply.shard_length) != (expected.offset, expected.length):
        with contextlib.suppress(grpc.RpcError):
            stub.Leave(ps_pb2.LeaveRequest(worker_id=reply.worker_id), timeout=LEAVE_TIMEOUT_S, metadata=metadata)
        channel.close()
        raise ServerMismatchError(
            f"{address} serves shard {reply.shard_index} [{reply.shard_offset}, "
            f"{reply.shard_offset + reply.shard_length}) but the layout puts shard {index} at "
            f"[{expected.offset}, {expected.end}); list the servers in shard order"
        )
    return ShardSession(address, stub, channel, reply.worker_id, expected, reply, DataPath(channel))


def first_join(
    join: Callable[[grpc.Channel, str, bool], ShardSession],
    open_channel: Callable[[str], grpc.Channel],
    replicas: Sequence[str],
    policy: RetryPolicy,
    patience_seconds: float,
    on_retry: Callable[[Recovery, grpc.RpcError, str, str, float, float], None],
    takes_over: bool = False,
) -> ShardSession:
    """Join (``join(channel, address, resume)``) the shard served by ``replicas``, starting with the
    first, with retries for up to ``patience_seconds``; a retry resumes, replacing a record an
    unanswered attempt may have left. With ``takes_over`` (the caller knows the name's earlier
    holder is dead) the first attempt resumes too. ``on_retry(recovery, error, old, new, call_seconds,
    failing_seconds)`` hears of every retry: the address it failed on, the one it goes to, how long
    the attempt took and how long the Join has been failing.

    A name still held by a joined worker (NAME_IN_USE: most often this worker's previous process,
    not yet expired) is retried without resume until that record's lease runs out, so a restarted
    worker comes back and two running workers never share a name. An attempt that got no answer
    is retried on a new channel (to the next replica of a set): a handshake swallowed by a silent
    link is not waited on again. A replica that is not the primary is followed to the one it names."""
    address = replicas[0]
    channel = open_channel(address)
    deadline = time.monotonic() + patience_seconds
    backoff = policy.initial_backoff
    resume = takes_over
    unanswered = 0
    # Once another worker was seen holding the name, never resume: that would take its record over.
    name_held = False
    failing_since: float | None = None
    while True:
        started = time.monotonic()
        try:
            return join(channel, address, resume)
        except grpc.RpcError as error:
            now = time.monotonic()
            failing_since = now if failing_since is None else failing_since
            recovery = join_recovery_for(error, policy)
            if recovery is Recovery.FAIL or now >= deadline:
                channel.close()
                raise
            target = next_address(recovery, error, replicas, address)
            on_retry(recovery, error, address, target, now - started, now - failing_since)
            if recovery is Recovery.RECONNECT or target != address:
                channel.close()
                address = target
                channel = open_channel(address)
            unanswered = unanswered + 1 if recovery is Recovery.RECONNECT else 0
            name_held = name_held or recovery is Recovery.WAIT_FOR_NAME
            resume = not name_held
        pause = quick_pause(recovery, unanswered, len(replicas))
        if pause is not None:
            time.sleep(pause)
            continue
        time.sleep(backoff * random.uniform(0.5, 1.0))
        backoff = min(policy.max_backoff, backoff * policy.multiplier)
