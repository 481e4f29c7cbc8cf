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
    _Handler = grpc.RpcMethodHandler[Any, Any]

# More than the server's methods (its service, health and reflection).
MAX_KEPT_METHODS = 64


class WrappedHandlers:
    """``wrap(handler, full_method_name)`` for each method, kept while the wrapped handler stays the same."""

    def __init__(self, wrap: Callable[[_Handler, str], _Handler], limit: int = MAX_KEPT_METHODS) -> None:
        self._wrap = wrap
        self._limit = limit
        self._kept: dict[str, tuple[_Handler, _Handler]] = {}

    def get(self, full_name: str, handler: _Handler) -> _Handler:
        kept = self._kept.get(full_name)
        if kept is not None and kept[0] is handler:
            return kept[1]
        wrapped = self._wrap(handler, full_name)
        if len(self._kept) < self._limit or full_name in self._kept:
            self._kept[full_name] = (handler, wrapped)
        return wrapped
