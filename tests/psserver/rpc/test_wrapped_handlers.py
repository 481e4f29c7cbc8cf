"""WrappedHandlers: one wrapper per method while the wrapped handler stays the same, and a bound."""

from __future__ import annotations

from typing import Any

import grpc

from psserver.rpc.wrapped_handlers import WrappedHandlers


def _handler() -> Any:
    return grpc.unary_unary_rpc_method_handler(lambda request, context: request)


def _recording(made: list[str]) -> Any:
    def wrap(handler: Any, name: str) -> Any:
        made.append(name)
        return _handler()

    return wrap


def test_a_method_is_wrapped_once_while_its_handler_is_the_same_and_again_when_it_changes() -> None:
    made: list[str] = []
    handlers = WrappedHandlers(_recording(made))
    first, other = _handler(), _handler()
    wrapped = handlers.get("/s/A", first)
    assert handlers.get("/s/A", first) is wrapped and made == ["/s/A"]
    assert handlers.get("/s/A", other) is not wrapped and made == ["/s/A", "/s/A"]
    assert handlers.get("/s/A", other) is handlers.get("/s/A", other) and len(made) == 2


def test_past_the_limit_new_methods_are_wrapped_per_call_and_not_kept() -> None:
    made: list[str] = []
    handlers = WrappedHandlers(_recording(made), limit=1)
    kept, handler = _handler(), _handler()
    handlers.get("/s/A", kept)
    handlers.get("/s/B", handler)
    handlers.get("/s/B", handler)
    handlers.get("/s/A", kept)
    assert made == ["/s/A", "/s/B", "/s/B"]
