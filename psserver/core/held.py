"""A read-only attribute of an orchestrator that one of its components holds under the same name."""

from __future__ import annotations

from typing import Generic, TypeVar, cast

T = TypeVar("T")


class Held(Generic[T]):
    """``attr: Held[T] = Held("_component")`` reads ``self._component.attr``; with ``lock="_lock"``,
    under ``self._lock`` (for a value the component may still be completing on another thread)."""

    def __init__(self, component: str, lock: str | None = None) -> None:
        self._component = component
        self._lock = lock

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    def __get__(self, shard: object, owner: type | None = None) -> T:
        if self._lock is None:
            return cast(T, getattr(getattr(shard, self._component), self._name))
        with getattr(shard, self._lock):
            return cast(T, getattr(getattr(shard, self._component), self._name))
