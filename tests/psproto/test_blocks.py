"""The 8-bit block codec (ALGORITHMS.md, "8-bit block codec for pushes") on tensors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from psproto import blocks
from psproto.blocks import BLOCK


def _round_trip(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, scales = blocks.encode(x)
    out = torch.empty_like(x)
    blocks.check_scales(scales, x.numel())
    blocks.decode(q, scales, out)
    return q, scales, out


def test_an_all_zero_block_round_trips_exactly() -> None:
    x = torch.zeros(BLOCK + 10)
    q, scales, out = _round_trip(x)
    assert torch.equal(scales, torch.zeros(2)) and torch.equal(q, torch.zeros(BLOCK + 10, dtype=torch.int8))
    assert torch.equal(out, x) and not out.signbit().any()


def test_a_zero_block_beside_a_nonzero_one_stays_zero() -> None:
    x = torch.zeros(2 * BLOCK)
    x[BLOCK:] = torch.linspace(-3, 5, BLOCK)
    _q, scales, out = _round_trip(x)
    assert scales[0] == 0 and scales[1] == pytest.approx(5 / 127)
    assert torch.equal(out[:BLOCK], x[:BLOCK])


def test_scales_are_max_abs_over_127_and_the_max_is_exact() -> None:
    x = torch.tensor([0.25, -2.54, 1.0, 0.0])
    q, scales, out = _round_trip(x)
    assert scales.tolist() == [torch.tensor(2.54 / 127, dtype=torch.float32).item()]
    assert q[1] == -127
    assert out[1] == pytest.approx(-2.54, rel=1e-6)


def test_a_block_of_tiny_subnormals_is_not_decoded_as_zero() -> None:
    # max|x| / 127 underflows to 0 in fp32: the block keeps the smallest positive scale.
    x = torch.tensor([1e-44, -3e-45, 0.0])
    _q, scales, out = _round_trip(x)
    assert scales.item() > 0
    assert bool(((x - out).abs() <= scales / 2).all())


def test_rounding_is_half_to_even() -> None:
    # max|x| = 127 makes s = 1: x / s is x itself.
    x = torch.tensor([127.0, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5])
    q, _, _ = _round_trip(x)
    assert q.tolist() == [127, 0, 2, 2, 0, -2, -2]


def test_the_last_partial_block_has_its_own_scale() -> None:
    x = torch.ones(2 * BLOCK + 5)
    x[-5:] = torch.tensor([0.0, 0.1, -0.2, 0.3, 0.4])
    q, scales, out = _round_trip(x)
    assert scales.numel() == 3
    assert scales[2] == pytest.approx(0.4 / 127)
    assert q[-1] == 127
    torch.testing.assert_close(out[-5:], x[-5:], atol=0.4 / 254 * 1.001, rtol=0)


# fp32 arithmetic (x / s, then q · s) may add a few ulps of 127·s to the exact s/2.
_ROUNDING_SLACK = 2**-12


@settings(max_examples=60, deadline=None)
@given(
    arrays(
        np.float32,
        st.integers(1, 2 * BLOCK + 7),
        elements=st.floats(-(2.0**100), 2.0**100, width=32),
        fill=st.floats(-1e6, 1e6, width=32),
    )
)
def test_every_element_decodes_within_half_a_step(values: np.ndarray) -> None:
    x = torch.from_numpy(values.copy())
    _, scales, out = _round_trip(x)
    step = scales.repeat_interleave(BLOCK)[: x.numel()].double()
    error = (x.double() - out.double()).abs()
    assert bool((error <= step / 2 * (1 + _ROUNDING_SLACK)).all())


@pytest.mark.parametrize(
    ("scales", "length", "non_finite", "match"),
    [
        ([1.0], BLOCK + 1, False, "1 scale"),
        ([1.0, 1.0, 1.0], BLOCK + 1, False, "3 scale"),
        ([1.0, -0.5], BLOCK + 1, False, "negative"),
        ([float("nan"), 1.0], BLOCK + 1, True, "NaN or Inf"),
        ([1.0, float("inf")], BLOCK + 1, True, "NaN or Inf"),
        ([1.0], 0, False, "1 scale"),
    ],
)
def test_scales_that_do_not_fit_the_values_are_refused(
    scales: list[float], length: int, non_finite: bool, match: str
) -> None:
    with pytest.raises(blocks.ScalesError, match=match) as caught:
        blocks.check_scales(torch.tensor(scales), length)
    assert caught.value.non_finite is non_finite


@pytest.mark.parametrize(
    ("scales", "safe"),
    [
        ([], True),
        ([0.0, 1.0, blocks.LARGEST_SAFE_SCALE], True),
        ([1.0, float(np.nextafter(np.float32(blocks.LARGEST_SAFE_SCALE), np.float32(np.inf)))], False),
        ([float(np.finfo(np.float32).max)], False),
    ],
)
def test_scales_that_fit_say_whether_their_values_can_overflow(scales: list[float], safe: bool) -> None:
    """Safe scales spare the server a finiteness pass over the decoded values; larger finite ones do not."""
    length = max(1, len(scales)) * BLOCK if scales else 0
    assert blocks.check_scales(torch.tensor(scales, dtype=torch.float32), length) is safe


def test_a_nan_among_negative_and_large_scales_is_refused_as_non_finite() -> None:
    scales = torch.tensor([-1.0, float(np.finfo(np.float32).max), float("nan")])
    with pytest.raises(blocks.ScalesError, match="NaN or Inf") as caught:
        blocks.check_scales(scales, 3 * BLOCK)
    assert caught.value.non_finite


_ANY_FLOAT32 = arrays(
    np.float32,
    st.integers(1, 2 * BLOCK + 7),
    elements=st.floats(-(2.0**100), 2.0**100, width=32) | st.floats(-(2.0**-126), 2.0**-126, width=32),
    fill=st.floats(-1e3, 1e3, width=32),
)


@settings(max_examples=60, deadline=None)
@given(_ANY_FLOAT32)
def test_the_compiled_encode_gives_the_reference_encodes_bits(values: np.ndarray) -> None:
    x = torch.from_numpy(values.copy())
    q, scales = blocks.encode(x)
    expected_q, expected_scales = blocks.reference_encode(x)
    assert torch.equal(q, expected_q)
    assert torch.equal(scales, expected_scales)


@settings(max_examples=60, deadline=None)
@given(_ANY_FLOAT32, st.booleans(), st.booleans())
def test_the_fused_error_feedback_encode_is_encode_of_p_plus_e_and_its_remainder(
    values: np.ndarray, with_residual: bool, in_place: bool
) -> None:
    x = torch.from_numpy(values.copy())
    previous = torch.linspace(-0.5, 0.5, x.numel()) if with_residual else None
    v = x + previous if previous is not None else x.clone()
    expected_q, expected_scales = blocks.reference_encode(v)
    decoded = torch.empty_like(v)
    blocks.decode(expected_q, expected_scales, decoded)
    residual_in = previous.clone() if previous is not None else None
    out = residual_in if in_place else None
    q, scales, residual = blocks.encode_with_feedback(x, residual_in, out)
    assert torch.equal(q, expected_q) and torch.equal(scales, expected_scales)
    assert torch.equal(residual, v - decoded)
    assert (residual is residual_in) is (in_place and with_residual)


def _bits(x: torch.Tensor) -> torch.Tensor:
    """The int32 bits of fp32 values, so that NaNs and signed zeros compare as the wire sends them."""
    return x.view(torch.int32)


@settings(max_examples=60, deadline=None)
@given(_ANY_FLOAT32, st.booleans(), st.sampled_from([None, 0, BLOCK // 2]))
def test_the_tensor_encode_gives_the_compiled_encodes_bits(
    values: np.ndarray, feedback: bool, non_finite_at: int | None
) -> None:
    """The encode a GPU worker runs on its device, checked here on CPU tensors bit for bit."""
    x = torch.from_numpy(values.copy())
    if non_finite_at is not None and non_finite_at < x.numel():
        x[non_finite_at] = float("nan") if non_finite_at else float("inf")
    previous = torch.linspace(-0.5, 0.5, x.numel())
    if feedback:
        expected_q, expected_scales, expected_residual = blocks.encode_with_feedback(x, previous.clone())
        q, scales, residual = blocks.encode_tensors(x, previous.clone(), feedback=True)
        assert residual is not None and torch.equal(_bits(residual), _bits(expected_residual))
    else:
        expected_q, expected_scales = blocks.encode(x)
        q, scales, residual = blocks.encode_tensors(x)
        assert residual is None
    assert torch.equal(q, expected_q)
    assert torch.equal(_bits(scales), _bits(expected_scales))


def test_the_tensor_encode_writes_the_residual_into_the_buffer_given() -> None:
    x = torch.linspace(-3.0, 3.0, BLOCK + 5)
    out = torch.full_like(x, 99.0)
    _q, _scales, residual = blocks.encode_tensors(x, None, out, feedback=True)
    assert residual is out
    expected = blocks.encode_with_feedback(x, None)[2]
    assert torch.equal(out, expected) and bool(out.abs().max() <= 3.0 / 127 / 2)


@pytest.mark.parametrize(("bad", "scale_is_nan"), [(float("nan"), True), (float("inf"), False), (-float("inf"), False)])
def test_a_block_with_nan_or_inf_gets_a_scale_the_server_refuses(bad: float, scale_is_nan: bool) -> None:
    x = torch.ones(2 * BLOCK)
    x[BLOCK + 3] = bad
    _q, scales = blocks.encode(x)
    assert scales[0] == 1 / 127
    assert bool(torch.isnan(scales[1])) is scale_is_nan and not bool(torch.isfinite(scales[1]))
    with pytest.raises(blocks.ScalesError) as caught:
        blocks.check_scales(scales, x.numel())
    assert caught.value.non_finite
