"""A server interceptor that times every RPC, from its arrival to its last response message.

Streaming responses are timed until the stream ends, so a Pull's latency includes sending
the parameters. The status code is the one the handler set (``context.abort`` included):
OK when it returned normally, CANCELLED when the client went away mid-stream, UNKNOWN for
an unexpected exception. Unknown methods are not recorded, so no caller can mint labels.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from psserver.rpc.wrapped_handlers import WrappedHandlers

if TYPE_CHECKING:  # the stubs' classes are generic; grpc's own are not subscriptable
    _Handler = grpc.RpcMethodHandler[Any, Any]
    _Interceptor = grpc.ServerInterceptor[Any, Any]
else:
    _Interceptor = grpc.ServerInterceptor


class RpcTimer(Protocol):
    def rpc_finished(self, service: str, method: str, code: str, seconds: float) -> None: ...


class LatencyInterceptor(_Interceptor):
    """Reports each RPC's duration and final status code to ``timer`` (e.g. ``ShardMetrics``)."""

    def __init__(self, timer: RpcTimer) -> None:
        self._timer = timer
        self._timed = WrappedHandlers(self._timed_handler)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], _Handler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> _Handler | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        return self._timed.get(handler_call_details.method, handler)

    def _timed_handler(self, handler: _Handler, full_name: str) -> _Handler:
        service, _, method = full_name.lstrip("/").rpartition("/")
        record = _Recorder(self._timer, service, method)
        serialize = {
            "request_deserializer": handler.request_deserializer,
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(record.unary(handler.unary_unary), **serialize)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(record.streaming(handler.unary_stream), **serialize)
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(record.unary(handler.stream_unary), **serialize)
        if handler.stream_stream is not None:
            return grpc.stream_stream_rpc_method_handler(record.streaming(handler.stream_stream), **serialize)
        return handler


def _code(context: grpc.ServicerContext, default: str) -> str:
    # ServicerContext.code() exists since grpcio 1.38; the type stubs do not know it yet.
    code: grpc.StatusCode | None = getattr(context, "code", lambda: None)()
    return code.name if code is not None else default


class _Recorder:
    def __init__(self, timer: RpcTimer, service: str, method: str) -> None:
        self._timer = timer
        self._service = service
        self._method = method

    def _finish(self, started: float, code: str) -> None:
        self._timer.rpc_finished(self._service, self._method, code, time.perf_counter() - started)

    def unary(
        self, behaviour: Callable[[Any, grpc.ServicerContext], Any]
    ) -> Callable[[Any, grpc.ServicerContext], Any]:
        def timed(request: Any, context: grpc.ServicerContext) -> Any:
            started = time.perf_counter()
            try:
                response = behaviour(request, context)
            except BaseException:
                self._finish(started, _code(context, "UNKNOWN"))
                raise
            self._finish(started, _code(context, "OK"))
            return response

        return timed

    def streaming(
        self, behaviour: Callable[[Any, grpc.ServicerContext], Iterator[Any]]
    ) -> Callable[[Any, grpc.ServicerContext], Iterator[Any]]:
        def timed(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            started = time.perf_counter()
            try:
                responses = behaviour(request, context)
            except BaseException:
                self._finish(started, _code(context, "UNKNOWN"))
                raise
            return self._timed_stream(responses, context, started)

        return timed

    def _timed_stream(self, responses: Iterator[Any], context: grpc.ServicerContext, started: float) -> Iterator[Any]:
        try:
            yield from responses
        except GeneratorExit:
            self._finish(started, "CANCELLED")
            raise
        except BaseException:
            self._finish(started, _code(context, "UNKNOWN"))
            raise
        self._finish(started, _code(context, "OK"))
