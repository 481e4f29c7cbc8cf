"""Why a request was refused, independent of the transport.

Each kind has a stable ``reason`` key (used in metrics and Status) and maps to exactly one
gRPC status code in psserver.rpc.
"""

from __future__ import annotations

import enum


class ErrorKind(enum.Enum):
    UNKNOWN_WORKER = "unknown_worker"
    LAYOUT_MISMATCH = "layout_mismatch"
    WRONG_LENGTH = "wrong_length"
    CHUNK_OUT_OF_RANGE = "chunk_out_of_range"
    UNKNOWN_DTYPE = "unknown_dtype"
    NON_FINITE = "non_finite"
    INIT_CONFLICT = "init_conflict"
    NOT_INITIALIZED = "not_initialized"
    FUTURE_CLOCK = "future_clock"
    BAD_REQUEST = "bad_request"
    # A configured limit (workers, parameters) would be exceeded.
    LIMIT_REACHED = "limit_reached"
    # An admin request for checkpoints on a server started without --checkpoint-dir.
    CHECKPOINTS_OFF = "checkpoints_off"
    # A Join (without resume) under the name of a worker that is still joined.
    NAME_IN_USE = "name_in_use"
    # A push that held a receive buffer and sent nothing for --receive-idle-seconds (cancelled).
    PUSH_STALLED = "push_stalled"

    @property
    def reason(self) -> str:
        return self.value


class ShardError(Exception):
    """A request the shard refused; nothing in the shard changed.

    ``counted``: already counted in the shard's refusals (Status ``rejected`` and metrics);
    the transport counts the ones it raises itself."""

    def __init__(self, kind: ErrorKind, message: str, counted: bool = False) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.counted = counted
