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


_ABS_BITS = 0x7FFFFFFF
_INF_BITS = 0x7F800000


@_compiled
def _largest_bits(bits: Any) -> Any:
    """The bits of ``max|x|`` over a block given as int32 bits: a non-negative float orders as its
    bits do, and every NaN's bits lie above +Inf's, so a block with a NaN gives a NaN, else one
    with ±Inf gives +Inf (as torch's max does). Integer max reduces in vector registers."""
    largest = np.int32(0)
    for i in range(bits.shape[0]):
        magnitude = bits[i] & np.int32(_ABS_BITS)
        largest = magnitude if magnitude > largest else largest
    return largest


@_compiled
def _quantise(x: Any, scale: Any, q: Any) -> None:
    levels = np.float32(127.0)
    for i in range(x.shape[0]):
        level = np.rint(x[i] / scale)
        level = levels if level > levels else level
        level = -levels if level < -levels else level
        q[i] = np.int8(level)


@_compiled
def _quantise_residual_in_place(values: Any, divisor: Any, scale: Any, q: Any) -> None:
    """As _quantise, and ``values ← values − q·s`` (the residual, written in place: with two
    arrays that might alias, the loop would fall back to scalar code). ``level + 0`` is the level
    as the int8 decodes (a rounded −0.0 becomes +0.0, as an integer has no sign of zero)."""
    levels = np.float32(127.0)
    zero = np.float32(0.0)
    for i in range(values.shape[0]):
        value = values[i]
        level = np.rint(value / divisor)
        level = levels if level > levels else level
        level = -levels if level < -levels else level
        q[i] = np.int8(level)
        values[i] = value - (level + zero) * scale


@_compiled
def _add(x: Any, previous: Any, out: Any) -> None:
    for i in range(x.shape[0]):
        out[i] = x[i] + previous[i]


@_compiled
def _encode(x: Any, previous: Any, q: Any, scales: Any, residual: Any, mode: int, block: int, smallest: Any) -> None:
    """Mode 0: encode ``x``. Modes 1 and 2: residual ← x (mode 1) or x + previous (mode 2) block by
    block (then still in cache), encode it, and residual ← residual − x̂ in place.

    Loops run over block views (``range(len)``): with an index that might be negative numba
    checks it per element, and the loop no longer vectorises."""
    levels = np.float32(127.0)
    largest = np.empty(1, dtype=np.int32)
    largest_value = largest.view(np.float32)
    n = x.shape[0]
    for b in range(scales.shape[0]):
        start = b * block
        stop = min(start + block, n)
        if mode == 1:
            residual[start:stop] = x[start:stop]
        elif mode == 2:
            _add(x[start:stop], previous[start:stop], residual[start:stop])
        source = x[start:stop] if mode == 0 else residual[start:stop]
        largest[0] = _largest_bits(source.view(np.int32))
        scale = largest_value[0] / levels
        # Tiny subnormals whose max / 127 underflows keep the smallest positive scale (psproto.blocks).
        if scale == np.float32(0.0) and largest_value[0] > np.float32(0.0):
            scale = smallest
        scales[b] = scale
        if not np.isfinite(scale):  # the push will be refused; what q holds does not matter
            q[start:stop] = 0
            continue
        # An all-zero block has s = 0 and q = 0: dividing it by 1 keeps it zero without a NaN.
        divisor = scale if scale > np.float32(0.0) else np.float32(1.0)
        if mode == 0:
            _quantise(source, divisor, q[start:stop])
        else:
            _quantise_residual_in_place(source, divisor, scale, q[start:stop])


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
