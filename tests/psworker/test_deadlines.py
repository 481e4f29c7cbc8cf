"""Every call's deadline: a fixed allowance, its payload at a floor rate, and the server's lease for
calls the server may hold back (that the client puts one on every call: test_deadlines_integ.py)."""

from __future__ import annotations

import pytest

from psproto import codec
from psworker.client import DeadlinePolicy
from psworker.deadlines import payload_bytes

MB = 1_000_000


def test_a_call_without_payload_gets_the_fixed_allowance() -> None:
    assert DeadlinePolicy(base_seconds=7.0).short() == 7.0
    assert DeadlinePolicy(base_seconds=7.0).transfer(0) == 7.0


def test_a_payload_gets_its_size_at_the_floor_rate() -> None:
    policy = DeadlinePolicy(base_seconds=10.0, min_bytes_per_second=1 * MB)
    # The 45 MB push: 45 s for the bytes on top of the allowance.
    assert policy.transfer(45 * MB) == pytest.approx(55.0)
    assert DeadlinePolicy(base_seconds=10.0, min_bytes_per_second=9 * MB).transfer(45 * MB) == pytest.approx(15.0)


def test_a_call_the_server_may_hold_back_also_gets_the_wait() -> None:
    policy = DeadlinePolicy(base_seconds=10.0, min_bytes_per_second=1 * MB)
    assert policy.transfer(2 * MB, wait_seconds=30.0) == pytest.approx(42.0)
    assert policy.transfer(-5, wait_seconds=-1.0) == 10.0  # nothing negative shortens a deadline


def test_payload_bytes_follow_the_wire_dtype() -> None:
    assert payload_bytes(1000, codec.FLOAT32) == 4000
    assert payload_bytes(1000, codec.UNSPECIFIED) == 4000
    assert payload_bytes(1000, codec.BFLOAT16) == payload_bytes(1000, codec.FLOAT16) == 2000
    # 8-bit pushes: a byte per value and a float32 scale per block of 4096.
    assert payload_bytes(1000, codec.INT8_BLOCK) == 1004
    assert payload_bytes(10_000, codec.INT8_BLOCK) == 10_012


@pytest.mark.parametrize(("base", "rate"), [(0.0, 1.0), (1.0, 0.0), (-1.0, 1.0), (float("nan"), 1.0)])
def test_a_deadline_policy_that_could_never_be_met_is_refused(base: float, rate: float) -> None:
    with pytest.raises(ValueError, match="positive allowance and rate"):
        DeadlinePolicy(base_seconds=base, min_bytes_per_second=rate)
