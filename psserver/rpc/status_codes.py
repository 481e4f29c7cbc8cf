"""One gRPC status code per refusal kind, so clients can react without parsing messages."""

from __future__ import annotations

import grpc

from psserver.core.errors import ErrorKind

STATUS_CODES: dict[ErrorKind, grpc.StatusCode] = {
    ErrorKind.UNKNOWN_WORKER: grpc.StatusCode.NOT_FOUND,
    ErrorKind.LAYOUT_MISMATCH: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorKind.WRONG_LENGTH: grpc.StatusCode.DATA_LOSS,
    ErrorKind.CHUNK_OUT_OF_RANGE: grpc.StatusCode.OUT_OF_RANGE,
    ErrorKind.UNKNOWN_DTYPE: grpc.StatusCode.UNIMPLEMENTED,
    ErrorKind.NON_FINITE: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.INIT_CONFLICT: grpc.StatusCode.ALREADY_EXISTS,
    ErrorKind.NOT_INITIALIZED: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorKind.FUTURE_CLOCK: grpc.StatusCode.OUT_OF_RANGE,
    ErrorKind.BAD_REQUEST: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.LIMIT_REACHED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.CHECKPOINTS_OFF: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorKind.NAME_IN_USE: grpc.StatusCode.ALREADY_EXISTS,
    # The transport cancels a stalled push, so its worker sees CANCELLED.
    ErrorKind.PUSH_STALLED: grpc.StatusCode.CANCELLED,
}
