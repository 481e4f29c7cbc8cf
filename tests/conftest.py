"""Fixtures shared across the test packages."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from psproto import inline_ops


@pytest.fixture
def two_threads() -> Iterator[None]:
    """torch's intra-op pool at two threads for the test (skipped where the pool is not OpenMP's)."""
    if inline_ops._openmp() is None:
        pytest.skip("torch's intra-op pool is not OpenMP here")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)
