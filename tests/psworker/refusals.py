"""Failed gRPC calls as grpc raises them, made without a server: a refusal with a rich status
(``psproto.errors.rich_status``, so they hold whatever the server in this checkout attaches) or a
failure without one (the transport's)."""

from __future__ import annotations

from collections.abc import Callable

import grpc

from psproto.errors import Reason, rich_status


class FakeRpcError(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    """A failed call as grpc raises it: code, details and the trailers a rich status travels in."""

    def __init__(self, status: grpc.Status) -> None:
        self._status = status

    def code(self) -> grpc.StatusCode:
        return self._status.code

    def details(self) -> str:
        return str(self._status.details)

    def trailing_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return tuple(self._status.trailing_metadata)

    def initial_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float | None:
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False


class BareStatus(grpc.Status):
    """A status without ErrorInfo in its trailers."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self.code = code
        self.details = details
        self.trailing_metadata = ()


def refusal(
    code: grpc.StatusCode, reason: Reason, message: str = "refused", metadata: dict[str, str] | None = None
) -> FakeRpcError:
    return FakeRpcError(rich_status(code, reason, message, metadata))


def bare(code: grpc.StatusCode, message: str = "") -> FakeRpcError:
    """A failure without ErrorInfo: the transport's, or an older server's."""
    return FakeRpcError(BareStatus(code, message))
