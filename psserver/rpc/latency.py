"""A server interceptor that times every RPC, from its arrival to its last response message.

Streaming responses are timed until the stream ends, so a Pull's latency includes sending
the parameters. The status code is the one the handler set (``context.abort`` included):
OK when it returned normally, CANCELLED when the client went away, UNKNOWN for an unexpected
exception. Unknown methods are not recorded, so no caller can mint labels.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, Protocol

import grpc

from psserver.rpc.wrapped_handlers import AioInterceptor, Handler, WrappedHandlers, rewrapped

Context = grpc.aio.ServicerContext[Any, Any]


class RpcTimer(Protocol):
    def rpc_finished(self, service: str, method: str, code: str, seconds: float) -> None: ...


class LatencyInterceptor(AioInterceptor):
    """Reports each RPC's duration and final status code to ``timer`` (e.g. ``ShardMetrics``)."""

    def __init__(self, timer: RpcTimer) -> None:
        self._timer = timer
        self._timed = WrappedHandlers(self._timed_handler)

    async def intercept_service(  # type: ignore[override]  # the stub forgets None (an unknown method)
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        return self._timed.get(handler_call_details.method, handler)

    def _timed_handler(self, handler: Handler, full_name: str) -> Handler:
        service, _, method = full_name.lstrip("/").rpartition("/")
        record = _Recorder(self._timer, service, method)
        return rewrapped(handler, record.unary, record.streaming)


def _code(context: Context, default: str) -> str:
    code: grpc.StatusCode | None = context.code()
    return code.name if code is not None else default


class _Recorder:
    def __init__(self, timer: RpcTimer, service: str, method: str) -> None:
        self._timer = timer
        self._service = service
        self._method = method

    def _finish(self, started: float, code: str) -> None:
        self._timer.rpc_finished(self._service, self._method, code, time.perf_counter() - started)

    def unary(
        self, behaviour: Callable[[Any, Context], Coroutine[Any, Any, Any]]
    ) -> Callable[[Any, Context], Coroutine[Any, Any, Any]]:
        async def timed(request: Any, context: Context) -> Any:
            started = time.perf_counter()
            try:
                response = await behaviour(request, context)
            except asyncio.CancelledError:
                self._finish(started, "CANCELLED")
                raise
            except BaseException:
                self._finish(started, _code(context, "UNKNOWN"))
                raise
            self._finish(started, _code(context, "OK"))
            return response

        return timed

    def streaming(
        self, behaviour: Callable[[Any, Context], AsyncIterator[Any]]
    ) -> Callable[[Any, Context], AsyncIterator[Any]]:
        async def timed(request: Any, context: Context) -> AsyncIterator[Any]:
            started = time.perf_counter()
            try:
                async for message in behaviour(request, context):
                    yield message
            except (GeneratorExit, asyncio.CancelledError):
                self._finish(started, "CANCELLED")
                raise
            except BaseException:
                self._finish(started, _code(context, "UNKNOWN"))
                raise
            self._finish(started, _code(context, "OK"))

        return timed
