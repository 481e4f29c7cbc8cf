"""The reasons a hetps server gives for a refusal: one list, shared by the wire and the server's core.

A reason travels as the ``reason`` of a ``google.rpc.ErrorInfo`` in domain :data:`DOMAIN`
(psproto.errors builds and reads it). This module is plain data, free of grpc, so the server's
core names its refusals with these same members (``psserver.core.errors.ErrorKind``).
docs/protocol.md lists every reason with its status code and what a client does about it.
"""

from __future__ import annotations

import enum

DOMAIN = "hetps"


class Reason(str, enum.Enum):
    """Every reason a hetps server gives for a refusal (UPPER_SNAKE_CASE, as ErrorInfo asks).

    New reasons may appear in any release: a client treats one it does not know like a refusal
    without a reason, by its status code."""

    UNKNOWN_WORKER = "UNKNOWN_WORKER"  # not joined (never, left, evicted, server restarted): Join again
    LAYOUT_MISMATCH = "LAYOUT_MISMATCH"  # another model, shard count or layout hash
    WRONG_LENGTH = "WRONG_LENGTH"  # chunks that do not cover the shard exactly
    CHUNK_OUT_OF_RANGE = "CHUNK_OUT_OF_RANGE"  # a chunk past the end of the shard
    UNKNOWN_DTYPE = "UNKNOWN_DTYPE"  # a wire dtype this server does not decode
    NON_FINITE = "NON_FINITE"  # NaN or Inf in a tensor or in push metadata
    INIT_CONFLICT = "INIT_CONFLICT"  # parameters already initialised with another layout
    NOT_INITIALIZED = "NOT_INITIALIZED"  # pull or push before any Init
    FUTURE_CLOCK = "FUTURE_CLOCK"  # a base clock ahead of the shard's (the server restarted behind)
    BAD_REQUEST = "BAD_REQUEST"  # a malformed or contradictory request
    LIMIT_REACHED = "LIMIT_REACHED"  # a configured limit (workers, parameters, receive buffers)
    CHECKPOINTS_OFF = "CHECKPOINTS_OFF"  # a checkpoint asked of a server without --checkpoint-dir
    CHECKPOINT_FAILED = "CHECKPOINT_FAILED"  # writing the checkpoint failed on the server
    NAME_IN_USE = "NAME_IN_USE"  # another joined worker has this name
    PUSH_STALLED = "PUSH_STALLED"  # a push that went idle, or fell behind the minimum transfer rate
    STREAM_STALLED = "STREAM_STALLED"  # an Init upload or a pull reply that went idle or fell behind that rate
    UNAUTHENTICATED = "UNAUTHENTICATED"  # a missing or wrong bearer token
    DRAINING = "DRAINING"  # the server is shutting down (SIGTERM) and takes no new calls
    ABANDONED = "ABANDONED"  # the client gave up (cancelled, deadline) on a call waiting in the shard
    NOT_PRIMARY = "NOT_PRIMARY"  # a replica that is not its shard's primary: metadata.primary names it
    STALE_EPOCH = "STALE_EPOCH"  # a replica message of an older epoch: its sender was deposed (fenced)

    @property
    def label(self) -> str:
        """The reason as a metrics label and a key of Status' ``rejected`` counts."""
        return self.value.lower()

    @property
    def reason(self) -> str:
        """The same as :attr:`label`, under the name the server's refusal kinds have always used
        (``ErrorKind.X.reason``)."""
        return self.label


class TransientLimit(str, enum.Enum):
    """The ``limit`` (ErrorInfo metadata) of a LIMIT_REACHED refusal that passes on its own, once
    other pushes have been received: a client sends the same call again after a backoff. A
    LIMIT_REACHED without one of these (``shard.max_workers``, ``shard.max_parameters``) does not pass."""

    RECEIVE_BUFFERS = "receive_buffers"  # every receive buffer stayed taken for the server's wait
    OPEN_PUSHES_PER_WORKER = "open_pushes_per_worker"  # this worker's earlier pushes are still being received
    RECEIVING_PUSHES = "receiving_pushes"  # shard.max_receiving_pushes other pushes are being received


# ErrorInfo metadata of a NOT_PRIMARY refusal: the primary's address (HOST:PORT; empty while none is
# known, during an election) and its epoch (decimal; empty with it).
PRIMARY_KEY = "primary"
EPOCH_KEY = "epoch"


# The ``limit`` of a LIMIT_REACHED refusal of a PushPullUnary whose reply would exceed the server's
# largest message: the client sends that shard's pushes as PushPull streams from then on.
UNARY_REPLY_LIMIT = "message_bytes"
