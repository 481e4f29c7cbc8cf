"""An interceptor's wrapped handlers, made once per method rather than once per RPC.

An interceptor that wraps every RPC's handler (timing it, gating it while draining) would build
the wrapper and its closures on every call. The wrapper is kept per method and reused while the
handler it wraps is the same object; a different one (a token refusal made for one call) is
wrapped afresh. At most ``limit`` methods are kept, so names a caller invents cannot grow it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

if TYPE_CHECKING:  # the stubs' classes are generic; grpc's own are not subscriptable
    Handler = grpc.RpcMethodHandler[Any, Any]
    AioInterceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    Handler = grpc.RpcMethodHandler
    AioInterceptor = grpc.aio.ServerInterceptor

# A wrapper of a handler's behaviour: for a single reply (a coroutine function) or a stream of them.
Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]


def rewrapped(handler: Handler, unary: Wrap, streaming: Wrap) -> Handler:
    """A handler of ``handler``'s shape and serializers whose behaviour is wrapped: by ``unary`` when
    it answers with one message, by ``streaming`` when it streams its answer."""
    serialize = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(unary(handler.unary_unary), **serialize)
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(streaming(handler.unary_stream), **serialize)
    if handler.stream_unary is not None:
        return grpc.stream_unary_rpc_method_handler(unary(handler.stream_unary), **serialize)
    if handler.stream_stream is not None:
        return grpc.stream_stream_rpc_method_handler(streaming(handler.stream_stream), **serialize)
    return handler


# More than the server's methods (its service, health and reflection).
MAX_KEPT_METHODS = 64


class WrappedHandlers:
    """``wrap(handler, full_method_name)`` for each method, kept while the wrapped handler stays the same."""

    def __init__(self, wrap: Callable[[Handler, str], Handler], limit: int = MAX_KEPT_METHODS) -> None:
        self._wrap = wrap
        self._limit = limit
        self._kept: dict[str, tuple[Handler, Handler]] = {}

    def get(self, full_name: str, handler: Handler) -> Handler:
        kept = self._kept.get(full_name)
        if kept is not None and kept[0] is handler:
            return kept[1]
        wrapped = self._wrap(handler, full_name)
        if len(self._kept) < self._limit or full_name in self._kept:
            self._kept[full_name] = (handler, wrapped)
        return wrapped
