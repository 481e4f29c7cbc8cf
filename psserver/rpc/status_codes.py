"""One gRPC status code per refusal reason, and the rich status a refusal is sent with.

The code is what generic gRPC tooling sees; the reason (a ``google.rpc.ErrorInfo`` in the
status details, psproto.errors) is what clients decide on. Two reasons may share a code
(FUTURE_CLOCK and CHUNK_OUT_OF_RANGE are both OUT_OF_RANGE); no reason has two codes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NoReturn

import grpc

from psproto.errors import Reason, rich_status

STATUS_CODES: dict[Reason, grpc.StatusCode] = {
    Reason.UNKNOWN_WORKER: grpc.StatusCode.NOT_FOUND,
    Reason.LAYOUT_MISMATCH: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.WRONG_LENGTH: grpc.StatusCode.DATA_LOSS,
    Reason.CHUNK_OUT_OF_RANGE: grpc.StatusCode.OUT_OF_RANGE,
    Reason.UNKNOWN_DTYPE: grpc.StatusCode.UNIMPLEMENTED,
    Reason.NON_FINITE: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.INIT_CONFLICT: grpc.StatusCode.ALREADY_EXISTS,
    Reason.NOT_INITIALIZED: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.FUTURE_CLOCK: grpc.StatusCode.OUT_OF_RANGE,
    Reason.BAD_REQUEST: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.LIMIT_REACHED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Reason.CHECKPOINTS_OFF: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.CHECKPOINT_FAILED: grpc.StatusCode.INTERNAL,
    Reason.NAME_IN_USE: grpc.StatusCode.ALREADY_EXISTS,
    # The transport cancels a stalled push or stream, so its client sees CANCELLED.
    Reason.PUSH_STALLED: grpc.StatusCode.CANCELLED,
    Reason.STREAM_STALLED: grpc.StatusCode.CANCELLED,
    Reason.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Reason.DRAINING: grpc.StatusCode.UNAVAILABLE,
    # Its client already gave up: nobody receives it; it is for the server's counts and logs.
    Reason.ABANDONED: grpc.StatusCode.CANCELLED,
    # A backup, or a primary whose lease ran out: the call is sent again to the primary named.
    Reason.NOT_PRIMARY: grpc.StatusCode.UNAVAILABLE,
    Reason.STALE_EPOCH: grpc.StatusCode.FAILED_PRECONDITION,
}


def refusal(reason: Reason, message: str, metadata: Mapping[str, str] | None = None) -> grpc.Status:
    """What a handler aborts with (``context.abort_with_status``): the reason's status code,
    the message for people and an ErrorInfo of ``reason`` (with ``metadata``) for programs."""
    return rich_status(STATUS_CODES[reason], reason, message, metadata)


async def refuse(context: grpc.aio.ServicerContext[Any, Any], status: grpc.Status) -> NoReturn:
    """End the call with ``status`` (a ``refusal``'s); raises, as the context's abort does."""
    # abort_with_status exists on gRPC's asyncio context; the type stubs leave it out.
    abort: Callable[[grpc.Status], Awaitable[None]] = getattr(context, "abort_with_status")  # noqa: B009
    await abort(status)
    raise AssertionError("abort_with_status returned")  # it raises AbortError
