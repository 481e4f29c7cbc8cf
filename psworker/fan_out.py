"""Running one call per shard at once, the last on the calling thread.

A client's pull or push goes to every shard concurrently. Handing every call to a thread pool
and waiting for it costs two thread switches per call, a visible share of a small model's step;
the last shard's call (with one shard, every call) runs on the calling thread instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

ResultT = TypeVar("ResultT")


def fan_out(pool: ThreadPoolExecutor, calls: Sequence[Callable[[], ResultT]]) -> list[ResultT]:
    """Every call's result, in order; the error of the first call (in order) that failed is raised."""
    if not calls:
        return []
    futures = [pool.submit(call) for call in calls[:-1]]
    try:
        mine = calls[-1]()
    except BaseException:
        for future in futures:
            future.result()  # an earlier call's error comes first
        raise
    return [*(future.result() for future in futures), mine]
