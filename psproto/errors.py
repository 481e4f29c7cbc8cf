"""Why a request was refused, as data: a reason a program switches on, beside the status code.

Every refusal a hetps server sends carries a ``google.rpc.Status`` in its trailers (the gRPC
rich-error convention) holding one ``google.rpc.ErrorInfo`` with ``domain == "hetps"`` and a
``reason`` from :class:`Reason`. Clients decide to retry, re-join or give up on the reason;
the message text is for people and may change in any release. docs/protocol.md lists every
reason with its status code and what a client does about it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

DOMAIN = "hetps"


class Reason(str, enum.Enum):
    """Every reason a hetps server gives for a refusal (UPPER_SNAKE_CASE, as ErrorInfo asks)."""

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
    PUSH_STALLED = "PUSH_STALLED"  # a push that held a receive buffer and sent nothing for too long
    UNAUTHENTICATED = "UNAUTHENTICATED"  # a missing or wrong bearer token

    @property
    def label(self) -> str:
        """The reason as a metrics label and a key of Status' ``rejected`` counts."""
        return self.value.lower()


def rich_status(
    code: grpc.StatusCode, reason: Reason, message: str, metadata: Mapping[str, str] | None = None
) -> grpc.Status:
    """The status a server aborts with: ``code``, ``message`` and an ErrorInfo of ``reason``."""
    info = error_details_pb2.ErrorInfo(reason=reason.value, domain=DOMAIN, metadata=dict(metadata or {}))
    status = status_pb2.Status(code=code.value[0], message=message)
    status.details.add().Pack(info)
    return rpc_status.to_status(status)


def error_info(error: grpc.RpcError) -> error_details_pb2.ErrorInfo | None:
    """The hetps ErrorInfo an RPC failed with; None for failures without one (a broken
    connection, a deadline, a server of another kind)."""
    if not isinstance(error, grpc.Call):
        return None
    try:
        status = rpc_status.from_call(error)
    except ValueError:  # trailers that contradict the call's own code or message
        return None
    if status is None:
        return None
    for detail in status.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info) and info.domain == DOMAIN:
            return info
    return None


def reason_of(error: grpc.RpcError) -> Reason | None:
    """The :class:`Reason` an RPC was refused for, or None when the server gave none we know."""
    info = error_info(error)
    if info is None:
        return None
    try:
        return Reason(info.reason)
    except ValueError:  # a reason from a newer server: treated like no reason
        return None
