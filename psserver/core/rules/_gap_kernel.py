"""Gap-Aware's element-wise update as one compiled pass over the shard (numba).

As separate torch ops the rule reads and writes each element about a dozen times, and the
``sqrt`` and the divisions are each as costly as a whole fused SGD step; compiled as one loop
it reads ``θ, g, v, q, θ_{b_w}`` once and writes ``θ, v, q`` once, vectorised (AVX where the
CPU has it). Per element, with ``floor = ε sqrt(1 − γ^k)`` and ``inverse = sqrt(1 − γ^k) / η_max``
so that ``C = (sqrt(v) + floor) / inverse``:

    v ← γ v + (1 − γ) q²            q = the momentum buffer before this push, or g without momentum
    G = 1 + |θ − θ_{b_w}| · inverse / (sqrt(v) + floor)
    g̃ = (g + wd θ) · (1 / G)
    momentum: q ← μ q + g̃ ;  θ ← θ − η q        SGD: θ ← θ − η g̃

The multiply-adds are rounded as torch's own SGD kernels round them (``g + wd θ`` and
``θ − η q`` as fused multiply-adds, ``μ q + g̃`` as a product then a sum), so with no gap
the result is the base optimizer's to float32 rounding. Sums of ``G − 1`` and ``1/G`` come
back for telemetry, accumulated in float64 (a mean gap near zero needs its digits);
reassociating them is what lets the loop vectorise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar, cast

import numpy as np
import torch
from numba import njit
from numba.extending import intrinsic

__all__ = ["Coefficients", "apply_elementwise"]


class Coefficients(NamedTuple):
    """The scalars of one push: the rule's options and the bound's ``floor`` and ``inverse`` now."""

    gamma: float
    floor: float
    inverse: float
    weight_decay: float
    momentum: float
    lr: float


def _fma_definition(typingctx: Any, a: Any, b: Any, c: Any) -> Any:
    """``a · b + c`` with one rounding (LLVM's fma), as torch's vectorised kernels compute it."""
    signature = a(a, b, c)

    def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
        return builder.fma(*args)

    return signature, codegen


# Called from compiled code as _fma(a, b, c); numba passes the typing context itself.
_fma: Any = intrinsic(_fma_definition)


# error_model="numpy": a float division by zero gives inf as in torch instead of raising, and
# without that check per element the loop vectorises. Only the reductions may be reassociated.
_FLAGS: dict[str, Any] = {"nogil": True, "error_model": "numpy", "fastmath": {"reassoc"}}

F = TypeVar("F", bound=Callable[..., Any])


def _compiled(function: F) -> F:
    """``function`` compiled by numba, cached on disk where numba finds a writable place.

    Numba caches beside the module or in the user's cache directory (``NUMBA_CACHE_DIR``
    overrides both); on a read-only file system with neither, it compiles in every process."""
    try:
        return cast(F, njit(cache=True, **_FLAGS)(function))
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return cast(F, njit(cache=False, **_FLAGS)(function))


# The kernels take their float32 scalars as one tuple; numba unpacks it once, before the loop.
@_compiled
def _gap_aware_momentum(
    theta: Any, gradient: Any, average: Any, buffer: Any, stale: Any, scalars: Any
) -> tuple[float, float]:
    gamma, one_minus_gamma, floor, inverse, weight_decay, momentum, neg_lr = scalars
    one = np.float32(1.0)
    gap_sum = 0.0
    penalty_sum = 0.0
    for i in range(theta.shape[0]):
        step = buffer[i]
        v = gamma * average[i] + one_minus_gamma * (step * step)
        average[i] = v
        p = theta[i]
        ratio = abs(p - stale[i]) * inverse / (np.sqrt(v) + floor)
        penalty = one / (one + ratio)
        penalised = _fma(p, weight_decay, gradient[i]) * penalty
        velocity = step * momentum + penalised
        buffer[i] = velocity
        theta[i] = _fma(velocity, neg_lr, p)
        gap_sum += ratio
        penalty_sum += penalty
    return gap_sum, penalty_sum


@_compiled
def _gap_aware_sgd(theta: Any, gradient: Any, average: Any, stale: Any, scalars: Any) -> tuple[float, float]:
    gamma, one_minus_gamma, floor, inverse, weight_decay, neg_lr = scalars
    one = np.float32(1.0)
    gap_sum = 0.0
    penalty_sum = 0.0
    for i in range(theta.shape[0]):
        g = gradient[i]
        v = gamma * average[i] + one_minus_gamma * (g * g)
        average[i] = v
        p = theta[i]
        ratio = abs(p - stale[i]) * inverse / (np.sqrt(v) + floor)
        penalty = one / (one + ratio)
        theta[i] = _fma(_fma(p, weight_decay, g) * penalty, neg_lr, p)
        gap_sum += ratio
        penalty_sum += penalty
    return gap_sum, penalty_sum


def apply_elementwise(
    params: torch.Tensor,
    gradient: torch.Tensor,
    average: torch.Tensor,
    buffer: torch.Tensor | None,
    stale: torch.Tensor,
    coefficients: Coefficients,
) -> tuple[float, float]:
    """One stale push of Gap-Aware, in place; returns (sum of G − 1, sum of 1/G) for telemetry.

    ``buffer`` is the momentum buffer, or None for plain SGD (then ``q = g``). Every tensor is
    a contiguous float32 CPU tensor of the same length; ``gradient`` is only read.
    """
    f32 = np.float32
    c = coefficients
    scalars = (f32(c.gamma), f32(1.0 - c.gamma), f32(c.floor), f32(c.inverse), f32(c.weight_decay))
    arrays = (params.numpy(), gradient.numpy(), average.numpy())
    if buffer is not None:
        momentum_scalars = (*scalars, f32(c.momentum), f32(-c.lr))
        gaps, penalties = _gap_aware_momentum(*arrays, buffer.numpy(), stale.numpy(), momentum_scalars)
    else:
        gaps, penalties = _gap_aware_sgd(*arrays, stale.numpy(), (*scalars, f32(-c.lr)))
    return float(gaps), float(penalties)


def warm_up() -> None:
    """Compile (or load from numba's cache) both loops now rather than on the first stale push."""
    one = torch.ones(1)
    for buffer in (torch.zeros(1), None):
        apply_elementwise(
            one.clone(), one.clone(), one.clone(), buffer, one.clone(), Coefficients(0.5, 1.0, 1.0, 0.0, 0.5, 0.1)
        )
