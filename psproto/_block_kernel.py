"""The 8-bit block codec's encode as one compiled pass per block (numba), with error feedback fused in.

As torch ops an encode with error feedback makes about ten passes over the push (``p + e``, the
per-block max, the division, rounding, clamping, the int8 cast, the decode and the new residual);
here each block of 4,096 values (16 KB, in cache) is read twice and written once: once for
``max|x|``, once to quantise and to write the residual ``e ← x − q·s``. The arithmetic is
psproto.blocks' to the bit: float32 throughout, ``s = max|x| / 127`` as a division,
``q = clamp(rint(x / s), −127, 127)`` (round half to even), ``x̂ = q · s``. A block holding a NaN
gets a NaN scale and one holding ±Inf (and no NaN) an infinite scale, as torch's max would give,
so the server refuses the push either way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

import numpy as np
from numba import njit

# error_model="numpy": dividing by zero gives inf rather than raising, with no check per element.
# No fastmath: a reciprocal in place of the division, or fused multiply-adds, would change bits.
_FLAGS: dict[str, Any] = {"nogil": True, "error_model": "numpy"}


F = TypeVar("F", bound=Callable[..., Any])


def _compiled_with(**flags: Any) -> Callable[[F], F]:
    """A decorator: the function compiled by numba with ``flags``, cached on disk where numba
    finds a writable place (on a read-only file system with none, compiled in every process)."""

    def compile_function(function: F) -> F:
        try:
            return cast(F, njit(cache=True, **_FLAGS, **flags)(function))
        except RuntimeError:  # "cannot cache function ...: no locator available"
            return cast(F, njit(cache=False, **_FLAGS, **flags)(function))

    return compile_function


_compiled = _compiled_with()


# Only for blocks known to be finite: the flags let the max reduction reorder and vectorise.
@_compiled_with(fastmath={"reassoc", "nnan", "ninf", "nsz"})
def _finite_largest(x: Any, start: int, stop: int) -> Any:
    """``max|x[start:stop]|`` of finite values, vectorised (the flags let the reduction reorder)."""
    largest = np.float32(0.0)
    for i in range(start, stop):
        largest = max(largest, abs(x[i]))
    return largest


@_compiled_with(fastmath={"reassoc"})
def _all_finite(x: Any, start: int, stop: int) -> bool:
    """Whether no value of ``x[start:stop]`` is NaN or infinite: x · 0 is 0 for every finite x."""
    poison = np.float32(0.0)
    zero = np.float32(0.0)
    for i in range(start, stop):
        poison += x[i] * zero
    return bool(poison == zero)


@_compiled
def _largest(x: Any, start: int, stop: int) -> Any:
    """``max|x[start:stop]|``: NaN if any value is NaN, else inf if any is infinite."""
    if _all_finite(x, start, stop):
        return _finite_largest(x, start, stop)
    largest = np.float32(0.0)
    for i in range(start, stop):
        a = abs(x[i])
        if np.isnan(a):
            return np.float32(np.nan)
        largest = max(largest, a)
    return largest


@_compiled
def _quantise(x: Any, start: int, stop: int, scale: Any, q: Any, residual: Any, feedback: bool) -> None:
    levels = np.float32(127.0)
    if not np.isfinite(scale):  # the push will be refused; what q holds does not matter
        for i in range(start, stop):
            q[i] = 0
        return
    divisor = scale if scale > np.float32(0.0) else np.float32(1.0)
    for i in range(start, stop):
        value = x[i]
        level = min(max(np.rint(value / divisor), -levels), levels)
        q[i] = np.int8(level)
        if feedback:
            residual[i] = value - level * scale


@_compiled
def _encode(x: Any, previous: Any, q: Any, scales: Any, residual: Any, mode: int, block: int, smallest: Any) -> None:
    """Mode 0: encode ``x``. Mode 1: encode ``x``, residual ← x − x̂. Mode 2: residual ← x + previous
    block by block (then still in cache), encode it, and residual ← residual − x̂."""
    levels = np.float32(127.0)
    n = x.shape[0]
    source = x if mode != 2 else residual
    for b in range(scales.shape[0]):
        start = b * block
        stop = min(start + block, n)
        if mode == 2:
            for i in range(start, stop):
                residual[i] = x[i] + previous[i]
        largest = _largest(source, start, stop)
        scale = largest / levels
        # Tiny subnormals whose max / 127 underflows keep the smallest positive scale (psproto.blocks).
        if scale == np.float32(0.0) and largest > np.float32(0.0):
            scale = smallest
        scales[b] = scale
        _quantise(source, start, stop, scale, q, residual, mode != 0)


def encode_blocks(x: np.ndarray, q: np.ndarray, scales: np.ndarray, block: int, smallest: float) -> None:
    """Fill ``q`` (int8) and ``scales`` (float32, one per block) from float32 ``x``."""
    _encode(x, x, q, scales, x, 0, block, np.float32(smallest))


def encode_blocks_with_feedback(
    x: np.ndarray,
    previous: np.ndarray | None,
    q: np.ndarray,
    scales: np.ndarray,
    residual: np.ndarray,
    block: int,
    smallest: float,
) -> None:
    """As :func:`encode_blocks` for ``v = x + previous`` (``previous`` None: ``v = x``), writing the
    new residual ``v − q·s`` into ``residual`` (which may be ``previous`` itself)."""
    mode = 1 if previous is None else 2
    _encode(x, x if previous is None else previous, q, scales, residual, mode, block, np.float32(smallest))
