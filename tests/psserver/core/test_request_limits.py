"""Bounds on names, devices, stats and metadata."""

from __future__ import annotations

import math

from psserver.core.request_limits import (
    MAX_ENTRIES,
    MAX_KEY_CHARS,
    non_finite_problem,
    numbers_problem,
    text_problem,
)


def test_text_within_the_limit_passes_and_past_it_says_by_how_much() -> None:
    assert text_problem("w" * 10, "worker_name", 10) is None
    assert text_problem("w" * 11, "worker_name", 10) == (
        "worker_name has 11 characters, more than the 10 allowed; shorten it"
    )


def test_numbers_are_bounded_in_count_and_key_length() -> None:
    assert numbers_problem({f"k{i}": 1.0 for i in range(MAX_ENTRIES)}, "stats") is None
    assert "65 entries" in str(numbers_problem({f"k{i}": 1.0 for i in range(MAX_ENTRIES + 1)}, "stats"))
    assert f"more than the {MAX_KEY_CHARS} allowed" in str(
        numbers_problem({"k" * (MAX_KEY_CHARS + 1): 1.0}, "metadata")
    )
    assert numbers_problem({"loss": math.nan}, "stats") is None  # the count and keys only


def test_non_finite_values_are_named() -> None:
    assert non_finite_problem({"a": 1.0, "b": -2.5}, "metadata") is None
    for value in (math.nan, math.inf, -math.inf):
        assert non_finite_problem({"pi_median": value}, "metadata") == (
            f"metadata['pi_median'] is {value}; send finite numbers"
        )
