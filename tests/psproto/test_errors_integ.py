"""psproto.errors over a real gRPC call: the reason a server aborts with is the reason a client reads.

The server here is a bare in-process gRPC server on 127.0.0.1 whose one method fails as its
request asks: rich statuses of every reason, a reason from a newer server, another domain's
ErrorInfo, and the plain ``context.abort`` of a server that sends no details."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from psproto.errors import DOMAIN, Reason, error_info, reason_of, rich_status

_METHOD = "/hetps.test.Errors/Fail"


def _fail(request: bytes, context: grpc.ServicerContext) -> bytes:
    """Abort as the JSON request says: {"how": "rich" | "foreign" | "plain", ...}."""
    asked = json.loads(request)
    if asked["how"] == "rich":
        context.abort_with_status(
            rich_status(grpc.StatusCode[asked["code"]], Reason(asked["reason"]), "no", asked["meta"])
        )
    if asked["how"] == "raw":  # an ErrorInfo in any domain and with any reason
        info = error_details_pb2.ErrorInfo(reason=asked["reason"], domain=asked["domain"])
        status = status_pb2.Status(code=grpc.StatusCode.ABORTED.value[0], message="raw")
        status.details.add().Pack(info)
        context.abort_with_status(rpc_status.to_status(status))
    context.abort(grpc.StatusCode.INTERNAL, "a server that sends no details")


@pytest.fixture(scope="module")
def call() -> Iterator[Callable[..., grpc.RpcError]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.unary_unary_rpc_method_handler(_fail)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("hetps.test.Errors", {"Fail": handler})])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    fail = channel.unary_unary(_METHOD, request_serializer=None, response_deserializer=None)  # bytes as they are

    def failed(**asked: object) -> grpc.RpcError:
        with pytest.raises(grpc.RpcError) as caught:
            fail(json.dumps(asked).encode(), timeout=10)
        return caught.value

    yield failed
    channel.close()
    server.stop(None)


def test_reasons_are_upper_snake_case_with_lower_case_labels() -> None:
    for reason in Reason:
        assert reason.value == reason.name and reason.value.isupper()
        assert reason.label == reason.reason == reason.value.lower()


@pytest.mark.parametrize("reason", list(Reason))
def test_every_reason_survives_a_real_call(call: Callable[..., grpc.RpcError], reason: Reason) -> None:
    code = grpc.StatusCode.FAILED_PRECONDITION
    error = call(how="rich", code=code.name, reason=reason.value, meta={"clock": "7"})
    assert error.code() == code
    assert error.details() == "no"
    assert reason_of(error) is reason
    info = error_info(error)
    assert info is not None
    assert info.domain == DOMAIN == "hetps"
    assert dict(info.metadata) == {"clock": "7"}


def test_a_reason_from_a_newer_server_is_no_reason(call: Callable[..., grpc.RpcError]) -> None:
    error = call(how="raw", reason="SOMETHING_NEW", domain=DOMAIN)
    assert error.code() == grpc.StatusCode.ABORTED
    assert reason_of(error) is None
    info = error_info(error)  # still there for logs
    assert info is not None and info.reason == "SOMETHING_NEW"


def test_another_domains_error_info_is_ignored(call: Callable[..., grpc.RpcError]) -> None:
    error = call(how="raw", reason="UNKNOWN_WORKER", domain="example.com")
    assert error_info(error) is None
    assert reason_of(error) is None


def test_a_call_without_details_has_no_reason(call: Callable[..., grpc.RpcError]) -> None:
    error = call(how="plain")
    assert error.code() == grpc.StatusCode.INTERNAL
    assert error_info(error) is None
    assert reason_of(error) is None


def test_an_error_that_is_not_a_call_has_no_reason() -> None:
    assert reason_of(grpc.RpcError()) is None
