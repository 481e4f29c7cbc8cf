"""Each refusal reason has one gRPC status code, and the rich status the server aborts with."""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2, status_pb2

from psproto.errors import Reason
from psserver.core.errors import ErrorKind
from psserver.rpc.status_codes import STATUS_CODES, refusal


def test_every_reason_has_one_status_code() -> None:
    assert set(STATUS_CODES) == set(Reason)
    assert grpc.StatusCode.OK not in STATUS_CODES.values()
    # Two situations that share a code differ by reason.
    assert STATUS_CODES[Reason.FUTURE_CLOCK] == STATUS_CODES[Reason.CHUNK_OUT_OF_RANGE] == grpc.StatusCode.OUT_OF_RANGE


def test_the_cores_error_kinds_are_the_reasons() -> None:
    assert ErrorKind.UNKNOWN_WORKER is Reason.UNKNOWN_WORKER
    assert ErrorKind.PUSH_STALLED.reason == "push_stalled"  # metrics label and Status.rejected key


def test_a_refusal_carries_the_reasons_code_message_and_error_info() -> None:
    status = refusal(Reason.UNKNOWN_WORKER, "join again", {"worker_id": "3"})
    assert status.code == grpc.StatusCode.NOT_FOUND
    assert status.details == "join again"
    [sent_bytes] = [value for key, value in status.trailing_metadata if key == "grpc-status-details-bin"]
    assert isinstance(sent_bytes, bytes)
    sent = status_pb2.Status.FromString(sent_bytes)
    assert (sent.code, sent.message) == (grpc.StatusCode.NOT_FOUND.value[0], "join again")
    info = error_details_pb2.ErrorInfo()
    assert len(sent.details) == 1 and sent.details[0].Unpack(info)
    assert (info.reason, info.domain, dict(info.metadata)) == ("UNKNOWN_WORKER", "hetps", {"worker_id": "3"})
