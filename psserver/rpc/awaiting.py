"""The core's steps run from an event loop: their work on a small pool of threads, their waits as awaits.

An operation of the shard that may wait (a pull SSP holds back, a push waiting for its BSP round,
for a rule's turn or for a receive buffer) is a generator of steps (``psserver.core.waiting``):
it yields a ``Pause`` with a lock held when it must wait. ``StepRunner.run`` runs each step on
the pool, lets go of the lock at a pause and awaits the next change of what the pause waits on
(its ``Signal``) on the event loop, so a waiting call holds no thread: the pool only does work,
and its size never has to grow with the number of workers.

At a change of that signal the event loop checks every waiting call's ``ready`` (under the
lock, taken only if free), and only a call that can go on, or whose slice ran out, goes back to
the pool. When the client gives up (the call's task is cancelled),
the step running is let finish, and the steps are resumed once more as abandoned: the core ends
the wait with its own refusal (ABANDONED, counted), or finishes what it could, then the task
ends cancelled.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from psserver.core.errors import ShardError
from psserver.core.waiting import Pause, Signal, Steps

T = TypeVar("T")


@dataclass(frozen=True)
class _Finished(Generic[T]):
    value: T


@dataclass(frozen=True)
class _Paused:
    pause: Pause
    # The signal's count of changes when the lock was let go: a change after it is not missed.
    seen: int


class ClientGone:
    """What the core asks while it waits (``Abandoned``): set once the call's client gave up."""

    def __init__(self) -> None:
        self.gone = False

    def __call__(self) -> bool:
        return self.gone


@dataclass(eq=False)
class _Waiter:
    future: asyncio.Future[None]
    ready: Callable[[], bool]
    timer: asyncio.TimerHandle | None = None


# How soon a wake-up tries again when a step holds the lock (it changes what the waiters read).
_RETRY_S = 0.0005


class _Waker:
    """Wakes the coroutines waiting on one signal, from whichever thread notified it.

    At a change it checks every waiter's ``ready`` itself, under one hold of the lock taken only
    when free, and wakes just the ones that can go on: hundreds of waiting calls cost one pass
    over cheap checks per change, not a task each."""

    def __init__(self, loop: asyncio.AbstractEventLoop, signal: Signal) -> None:
        self._loop = loop
        self._signal = signal
        self._waiters: set[_Waiter] = set()
        self._scheduled = False
        self.stop = signal.listen(self._notified)

    def _notified(self) -> None:
        # Under the signal's lock, on any thread: many changes before the loop runs wake once.
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        self._scheduled = False
        if not self._waiters:
            return
        lock = self._signal.lock
        if not lock.acquire(blocking=False):
            self._scheduled = True
            self._loop.call_later(_RETRY_S, self._wake)
            return
        try:
            going_on = [waiter for waiter in self._waiters if waiter.ready()]
        finally:
            lock.release()
        for waiter in going_on:
            _resolve(waiter)

    async def changed(self, pause: Pause, seen: int) -> None:
        """Return once ``pause.ready`` holds after a change of the signal since ``seen``, or after
        ``pause.seconds`` (its steps then look again: leases, a client that gave up)."""
        waiter = _Waiter(self._loop.create_future(), pause.ready)
        if pause.seconds is not None:
            waiter.timer = self._loop.call_later(pause.seconds, _resolve, waiter)
        self._waiters.add(waiter)
        if self._signal.changes != seen and not self._scheduled:
            # It changed after the step let go of the lock and before this waiter was listed.
            self._scheduled = True
            self._loop.call_soon(self._wake)
        try:
            await waiter.future
        finally:
            self._waiters.discard(waiter)
            if waiter.timer is not None:
                waiter.timer.cancel()


def _resolve(waiter: _Waiter) -> None:
    if not waiter.future.done():
        waiter.future.set_result(None)


class StepRunner:
    """Runs calls and steps of the core for the transport's coroutines, on one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pool: futures.ThreadPoolExecutor) -> None:
        self._loop = loop
        self._pool = pool
        self._wakers: dict[int, tuple[Signal, _Waker]] = {}

    async def call(self, function: Callable[..., T], *args: Any) -> T:
        """``function(*args)`` on the pool: core calls that take the lock, or compute."""
        return await self._loop.run_in_executor(self._pool, functools.partial(function, *args))

    async def call_brief(self, busy: Callable[[], bool], function: Callable[..., T], *args: Any) -> T:
        """``function(*args)``, a call that holds the shard's lock only briefly (a heartbeat, a leave, a
        status): on the loop itself while ``busy`` says nobody holds the lock, so it never queues on
        the pool behind pushes and pulls (a late heartbeat reads as a dead server); on the pool when
        the lock is held, so the loop never waits out an update."""
        if not busy():
            return function(*args)
        return await self.call(function, *args)

    async def run(self, steps: Steps[T], gone: ClientGone) -> T:
        """Run ``steps`` to their result, waiting at each pause without a thread.

        Cancelled (the client gave up): ``gone`` is set and the steps run on as abandoned (the core
        refuses, counting it) or are closed; then the cancellation goes on."""
        outcome: _Finished[T] | _Paused = await self._step(steps, None, gone)
        while isinstance(outcome, _Paused):
            try:
                await self._until_changed(outcome)
            except asyncio.CancelledError:
                await self._abandon(steps, outcome.pause, gone)
                raise
            outcome = await self._step(steps, outcome.pause, gone)
        return outcome.value

    async def _step(self, steps: Steps[T], paused: Pause | None, gone: ClientGone) -> _Finished[T] | _Paused:
        """One step on the pool; if the client gives up meanwhile, the step still finishes first."""
        step = self._loop.run_in_executor(self._pool, _advance, steps, paused)
        try:
            return await asyncio.shield(step)
        except asyncio.CancelledError:
            outcome = await _unless_cancelled_again(step)
            if isinstance(outcome, _Paused):
                await self._abandon(steps, outcome.pause, gone)
            raise

    async def _until_changed(self, paused: _Paused) -> None:
        await self._waker(paused.pause.signal).changed(paused.pause, paused.seen)

    def _waker(self, signal: Signal) -> _Waker:
        kept = self._wakers.get(id(signal))
        if kept is None or kept[0] is not signal:
            # A signal is the shard's or a receive-buffer pool's; a pool is replaced when the
            # shard's length is set, so a replaced signal's waker stops listening.
            if kept is not None:
                kept[1].stop()
            kept = (signal, _Waker(self._loop, signal))
            self._wakers[id(signal)] = kept
        return kept[1]

    async def _abandon(self, steps: Steps[Any], pause: Pause, gone: ClientGone) -> None:
        """End paused steps whose client gave up: resumed once as abandoned, closed if they pause again."""
        gone.gone = True
        await _unless_cancelled_again(self._loop.run_in_executor(self._pool, _resume_abandoned, steps, pause))

    def stop(self) -> None:
        for _, waker in self._wakers.values():
            waker.stop()
        self._wakers.clear()


async def _unless_cancelled_again(step: asyncio.Future[T]) -> T | None:
    """The result of a step already running on the pool (its error swallowed), however often the task
    is cancelled meanwhile: a step is never abandoned halfway."""
    while True:
        try:
            return await asyncio.shield(step)
        except asyncio.CancelledError:
            if step.done():
                return None if step.cancelled() or step.exception() is not None else step.result()
        except Exception:
            return None


def _advance(steps: Steps[T], paused: Pause | None) -> _Finished[T] | _Paused:
    """Run ``steps`` to their next pause (its lock let go) or their end; steps resumed from a pause
    take the lock it held first, as a condition's wait would."""
    try:
        if paused is None:
            pause = next(steps)
        else:
            paused.signal.lock.acquire()
            pause = steps.send(None)
    except StopIteration as done:
        return _Finished(done.value)
    seen = pause.signal.changes
    pause.signal.lock.release()
    return _Paused(pause, seen)


def _resume_abandoned(steps: Steps[Any], paused: Pause) -> None:
    """Resume steps whose client gave up: they refuse as abandoned (or finish); closed if they pause again."""
    paused.signal.lock.acquire()
    try:
        steps.send(None)
    except (StopIteration, ShardError):
        return
    # Paused again (a wait that no client ends), holding the lock again: GeneratorExit at the
    # pause, and the steps' ``with lock`` blocks let go of it.
    steps.close()
