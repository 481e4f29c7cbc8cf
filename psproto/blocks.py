"""The 8-bit block codec for pushes (ALGORITHMS.md, "8-bit block codec for pushes"), on tensors.

Values are cut into blocks of ``BLOCK`` starting at the first element given (a chunk's offset);
per block ``s = max|x| / 127`` in fp32 (``s = 0`` for an all-zero block),
``q = clamp(round_half_even(x / s), -127, 127)`` as int8, decoded ``x̂ = q · s`` in fp32. The
last block may be shorter. psproto.codec puts ``q`` and the scales into a chunk; this module
knows nothing of messages. The encodes run as one compiled pass per block (psproto._block_kernel);
:func:`reference_encode` is the same equation in torch operations.
"""

from __future__ import annotations

import math

import torch

BLOCK = 4096
# The largest |q|: the codec is symmetric, so -128 is never sent.
LEVELS = 127
# The smallest positive fp32 (a subnormal): the scale of a block whose max|x| / 127 underflows.
SMALLEST_SCALE = torch.finfo(torch.float32).smallest_normal * 2.0**-23
_SMALLEST = torch.tensor(SMALLEST_SCALE)
# The largest scale whose decoded values (|q| <= 127) cannot overflow fp32: the float below
# FLT_MAX / 127, so that 127 times it, rounded, stays finite. An encoder never sends more
# (max|x| <= FLT_MAX); a scale above it may decode to ±Inf, which the server then finds.
LARGEST_SAFE_SCALE = float(
    torch.nextafter(torch.tensor(torch.finfo(torch.float32).max / LEVELS), torch.tensor(0.0)).item()
)


class ScalesError(ValueError):
    """Scales that do not describe a chunk's values; ``non_finite`` tells NaN/Inf apart."""

    def __init__(self, message: str, non_finite: bool = False) -> None:
        super().__init__(message)
        self.non_finite = non_finite


def block_count(length: int) -> int:
    """How many scales a chunk of ``length`` values carries."""
    return math.ceil(length / BLOCK)


def _rows(x: torch.Tensor) -> list[tuple[slice, torch.Tensor]]:
    """``x`` as (block slice, 2-D view): the full blocks as one matrix, then the short last block."""
    full = x.numel() // BLOCK
    rows: list[tuple[slice, torch.Tensor]] = []
    if full:
        rows.append((slice(0, full), x[: full * BLOCK].view(full, BLOCK)))
    if x.numel() % BLOCK:
        rows.append((slice(full, full + 1), x[full * BLOCK :].view(1, -1)))
    return rows


def encode(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q as int8, one fp32 scale per block) of a contiguous 1-D tensor (encoded as fp32)."""
    from psproto._block_kernel import encode_blocks  # numba loads where 8-bit pushes are sent, only

    x = x.float().contiguous()
    q = torch.empty(x.numel(), dtype=torch.int8)
    scales = torch.empty(block_count(x.numel()), dtype=torch.float32)
    encode_blocks(x.numpy(), q.numpy(), scales.numpy(), BLOCK, SMALLEST_SCALE)
    return q, scales


def encode_with_feedback(
    x: torch.Tensor, residual: torch.Tensor | None, out: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Error feedback's encode in one pass: (q, scales, e') for ``v = x + residual`` (``residual``
    None: zero), where ``e' = v − q·s`` is the new residual, written into ``out`` (a new tensor
    when None; it may be ``residual`` itself). ``x`` is 1-D; the bits are those of
    ``reference_encode(v)`` and of ``v − decode``."""
    from psproto._block_kernel import encode_blocks_with_feedback

    values = x.float().contiguous()
    updated = out if out is not None else torch.empty_like(values)
    q = torch.empty(values.numel(), dtype=torch.int8)
    scales = torch.empty(block_count(values.numel()), dtype=torch.float32)
    previous = None if residual is None else residual.numpy()
    encode_blocks_with_feedback(
        values.numpy(), previous, q.numpy(), scales.numpy(), updated.numpy(), BLOCK, SMALLEST_SCALE
    )
    return q, scales, updated


def encode_tensors(
    x: torch.Tensor, residual: torch.Tensor | None = None, out: torch.Tensor | None = None, feedback: bool = False
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """:func:`encode` (``feedback`` False) or :func:`encode_with_feedback` as torch operations on
    the device that holds ``x`` (a GPU worker's update is encoded where it was computed, and only
    the int8 values and scales cross to the host): (q, scales, e') with e' None without feedback.

    The arithmetic is the compiled pass's to the bit: ``v = x + residual``, ``s = max|x| / 127``
    as a division, ``q = clamp(round_half_even(v / s), −127, 127)``, ``e' = v − q·s`` as a product
    then a difference (two operations, never fused); a block with a NaN or ±Inf gets that scale,
    q = 0 and e' = v (the push will be refused)."""
    values = x.float()
    if feedback:
        updated = out if out is not None else torch.empty_like(values)
        if residual is None:
            updated.copy_(values)
        else:
            torch.add(values, residual, out=updated)
        values = updated
    q = torch.empty(values.numel(), dtype=torch.int8, device=values.device)
    scales = torch.empty(block_count(values.numel()), dtype=torch.float32, device=values.device)
    for (rows, block_values), (_, q_row) in zip(_rows(values), _rows(q), strict=True):
        largest = block_values.abs().amax(dim=1)  # NaN wins over Inf, Inf over any number, as in max
        # A tensor divisor: CUDA turns division by a Python scalar into a product with its
        # reciprocal, which is not the division's bits.
        s = torch.div(largest, torch.full_like(largest, LEVELS))
        s = torch.where((s == 0) & (largest > 0), _SMALLEST.to(s.device), s)
        finite = torch.isfinite(s)
        divisor = torch.where(s > 0, s, torch.ones_like(s))  # NaN > 0 is false: a NaN block divides by 1
        levels = torch.div(block_values, divisor[:, None]).round_().clamp_(-LEVELS, LEVELS)
        q_row.copy_(torch.where(finite[:, None], levels, torch.zeros_like(levels)))
        scales[rows] = s
        if feedback:
            # q as float is the level with +0 for a rounded −0, as the int8 decodes; a refused block keeps e' = v.
            decoded = q_row.float().mul_(torch.where(finite, s, torch.zeros_like(s))[:, None])
            block_values.sub_(decoded)
    return q, scales, values if feedback else None


def reference_encode(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`encode` as torch operations, block rows at a time: the equation's plain reading, kept
    to check the compiled pass against (and ten passes over the data where that makes two)."""
    x = x.float() if x.dtype != torch.float32 else x
    q = torch.empty(x.numel(), dtype=torch.int8)
    scales = torch.empty(block_count(x.numel()), dtype=torch.float32)
    for (blocks, values), (_, q_row) in zip(_rows(x), _rows(q), strict=True):
        s = scales[blocks]
        low, high = torch.aminmax(values, dim=1)  # max|x| without a block-sized |x| temporary
        largest = torch.maximum(high, low.neg()).abs_()  # abs: +0, never -0, for an all-zero block
        torch.div(largest, LEVELS, out=s)
        # A block of tiny subnormals whose max|x| / 127 underflows to 0 keeps the smallest positive
        # scale instead, so s = 0 still means an all-zero block and |x − x̂| ≤ s/2 still holds.
        s.copy_(torch.where((s == 0) & (largest > 0), _SMALLEST, s))
        # An all-zero block has s = 0 and q = 0; dividing it by 1 keeps it zero without a NaN.
        divisor = torch.where(s > 0, s, torch.ones_like(s))
        q_row.copy_(torch.div(values, divisor[:, None]).round_().clamp_(-LEVELS, LEVELS))
    return q, scales


def check_scales(scales: torch.Tensor, length: int) -> bool:
    """Refuse scales that do not fit ``length`` values: the wrong count, negative, NaN or Inf.

    True when every scale is at most ``LARGEST_SAFE_SCALE``, so no decoded value can overflow and
    the values need no finiteness check of their own. One pass over the scales decides the usual
    case (min and max propagate a NaN); the detailed checks run only when it fails."""
    expected = block_count(length)
    if scales.numel() != expected:
        raise ScalesError(
            f"{scales.numel()} scale(s) for {length} values; send one float32 scale per block of {BLOCK} values "
            f"({expected})"
        )
    if scales.numel() == 0:
        return True
    low, high = (float(bound) for bound in torch.aminmax(scales))
    if low >= 0.0 and high <= LARGEST_SAFE_SCALE:
        return True
    if not bool(torch.isfinite(scales).all()):
        bad = int((~torch.isfinite(scales)).sum())
        raise ScalesError(f"{bad} block scale(s) are NaN or Inf; nothing was applied", non_finite=True)
    if bool((scales < 0).any()):
        raise ScalesError(f"{int((scales < 0).sum())} block scale(s) are negative; a scale is max|x| / 127 >= 0")
    return False


def decode(q: torch.Tensor, scales: torch.Tensor, out: torch.Tensor) -> None:
    """Write ``x̂ = q · s`` (fp32) into ``out``; the scales must have passed ``check_scales``."""
    for (blocks, values), (_, destination) in zip(_rows(q), _rows(out), strict=True):
        destination.copy_(values)
        destination.mul_(scales[blocks][:, None])
