"""Why a request was refused, as data: a reason a program switches on, beside the status code.

Every refusal a hetps server sends carries a ``google.rpc.Status`` in its trailers (the gRPC
rich-error convention) holding one ``google.rpc.ErrorInfo`` with ``domain == "hetps"`` and a
``reason`` from :class:`Reason`. Clients decide to retry, re-join or give up on the reason;
the message text is for people and may change in any release. docs/protocol.md lists every
reason with its status code and what a client does about it.
"""

from __future__ import annotations

from collections.abc import Mapping

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

# The list of reasons is plain data (psproto.reasons, free of grpc); it is re-exported here
# because clients reach for it beside reason_of.
from psproto.reasons import DOMAIN, Reason

__all__ = ["DOMAIN", "Reason", "error_info", "reason_of", "rich_status"]


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


def limit_of(error: grpc.RpcError) -> str | None:
    """Which configured limit a LIMIT_REACHED refusal names (its ErrorInfo's ``limit``), if any."""
    info = error_info(error)
    return None if info is None else info.metadata.get("limit")


def reason_of(error: grpc.RpcError) -> Reason | None:
    """The :class:`Reason` an RPC was refused for, or None when the server gave none we know."""
    info = error_info(error)
    if info is None:
        return None
    try:
        return Reason(info.reason)
    except ValueError:  # a reason from a newer server: treated like no reason
        return None
