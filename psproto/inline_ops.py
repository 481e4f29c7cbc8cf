"""Torch operations on chunks, run on the calling thread instead of torch's intra-op pool.

torch splits an elementwise operation on more than 32,768 elements across its intra-op threads.
A chunk (1 MiB by default) is large enough to be split and small enough that waking the pool
costs more than the copy itself, once per chunk, dozens of times per step: on a 16-core host a
CUDA worker's push and pull of a ResNet-18 took 127 ms with torch's 16 intra-op threads against
72–77 ms with one (``benchmarks.gpu_step``, docs/performance.md). :func:`inline_torch_ops` gives
the calling thread one intra-op thread while it moves chunks and puts its count back after, so
the same process's model or rule (one large operation, where the pool pays) keeps its threads.

OpenMP's thread count is a per-thread setting, and torch reads it for every parallel operation,
so setting it through the OpenMP runtime torch loaded changes this thread alone; other threads
are untouched (``torch.set_num_threads`` would also change the default of threads started
later, and resize a process-wide pool). Where torch's parallel backend is not OpenMP, or its
runtime's symbols are not visible, the guard does nothing.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import cache
from typing import Any, TypeVar

import torch

T = TypeVar("T")
_END: Any = object()


@cache
def _openmp() -> Any | None:
    """The OpenMP runtime torch runs its intra-op pool on, or None when it has none we can reach."""
    if "OpenMP" not in torch.__config__.parallel_info():
        return None
    try:
        runtime = ctypes.CDLL(None)  # torch loads its OpenMP runtime into the global namespace
        runtime.omp_set_num_threads.argtypes = [ctypes.c_int]
    except (AttributeError, OSError):
        return None
    # Another OpenMP runtime loaded first would answer instead, and setting it would not reach torch.
    threads = torch.get_num_threads()
    runtime.omp_set_num_threads(threads + 1)
    reaches_torch = torch.get_num_threads() == threads + 1
    runtime.omp_set_num_threads(threads)
    return runtime if reaches_torch else None


@contextmanager
def inline_torch_ops() -> Iterator[None]:
    """Within the block, torch operations started by this thread run on this thread alone."""
    runtime = _openmp()
    threads = torch.get_num_threads()  # also sets up this thread's count first, so ours is not overwritten
    if runtime is None or threads == 1:
        yield
        return
    runtime.omp_set_num_threads(1)
    try:
        yield
    finally:
        runtime.omp_set_num_threads(threads)


def inline_each(items: Iterable[T]) -> Iterator[T]:
    """``items``, each made with :func:`inline_torch_ops` on the thread that asks for it (gRPC's
    sending thread, for a request stream), which holds the guard only while it makes one."""
    iterator = iter(items)
    while True:
        with inline_torch_ops():
            item = next(iterator, _END)
        if item is _END:
            return
        yield item
