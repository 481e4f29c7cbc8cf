"""Why a request was refused, independent of the transport.

The kinds of refusal are the wire's reasons (:class:`psproto.reasons.Reason`): one list, so a
refusal the core raises reaches the client as that same reason in a ``google.rpc.ErrorInfo``.
``kind.reason`` (the lower-case ``label``) keys metrics and Status' ``rejected`` counts; each
kind maps to exactly one gRPC status code in psserver.rpc.status_codes.
"""

from __future__ import annotations

from collections.abc import Mapping

from psproto.reasons import Reason

# The core's name for the reasons it refuses with; ErrorKind.UNKNOWN_WORKER is Reason.UNKNOWN_WORKER.
ErrorKind = Reason


class ShardError(Exception):
    """A request the shard refused; nothing in the shard changed.

    ``counted``: already counted in the shard's refusals (Status ``rejected`` and metrics);
    the transport counts the ones it raises itself. ``metadata``: machine-readable facts for
    the client (the ErrorInfo's metadata), such as the shard's clock; usually empty."""

    def __init__(
        self, kind: ErrorKind, message: str, counted: bool = False, *, metadata: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.counted = counted
        self.metadata: dict[str, str] = dict(metadata or {})
