"""SA: θ ← θ − (η / max(τ, 1)) g, or η / (τ + 1) with offset=1."""

from __future__ import annotations

import re

import pytest
import torch

from psserver.core.errors import ErrorKind, ShardError
from psserver.core.rules import PayloadKind, RuleOptionError, RuleSpec
from tests.psserver.core.rules.conftest import INITIAL, Cluster

G1 = torch.tensor([1.0, 2.0, -1.0, 0.5, 0.0, 4.0])
G2 = torch.tensor([-3.0, 1.0, 2.0, 2.0, 1.0, -1.0])
G3 = torch.tensor([0.5, -0.5, 1.0, 0.0, -2.0, 1.0])


@pytest.mark.parametrize("offset", [0, 1])
def test_three_pushes_scaled_by_staleness(offset: int) -> None:
    cluster = Cluster("sa", lr="0.6", offset=str(offset))
    a, b = cluster.join("a"), cluster.join("b")
    cluster.pull_each(a, b)
    fresh = cluster.push(a, G1)
    cluster.pull(a)
    cluster.push(a, G2)
    stale = cluster.push(b, G3)  # pulled at clock 0, applied at clock 2

    def scale(tau: int) -> float:
        return 1 / (tau + 1) if offset else 1 / max(tau, 1)

    expected = INITIAL - 0.6 * scale(0) * G1 - 0.6 * scale(0) * G2 - 0.6 * scale(2) * G3
    torch.testing.assert_close(cluster.params, expected)
    assert fresh.telemetry["scale"] == 1.0
    assert stale.staleness == 2
    assert stale.telemetry["scale"] == pytest.approx(1 / 3 if offset else 1 / 2)


def test_a_staleness_of_one_is_not_penalised_without_offset() -> None:
    cluster = Cluster("sa", lr="1.0")
    a, b = cluster.join("a"), cluster.join("b")
    cluster.pull_each(a, b)
    cluster.push(a, G1)
    assert cluster.push(b, G2).telemetry["scale"] == 1.0
    torch.testing.assert_close(cluster.params, INITIAL - G1 - G2)


def test_a_delta_push_is_refused() -> None:
    cluster = Cluster("sa")
    a = cluster.join()
    cluster.pull(a)
    with pytest.raises(ShardError) as refused:
        cluster.push(a, G1, PayloadKind.DELTA)
    assert refused.value.kind is ErrorKind.BAD_REQUEST
    torch.testing.assert_close(cluster.params, INITIAL)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"offset": "2"}, "option offset=2 is out of range: 0 <= value <= 1"),
        ({"offset": "0.5"}, "is not a valid int"),
        ({"staleness": "1"}, "unknown option staleness; valid options: lr, offset"),
        ({"lr": "0"}, "option lr=0 is out of range"),
    ],
)
def test_invalid_options_are_refused(options: dict[str, str], message: str) -> None:
    with pytest.raises(RuleOptionError, match=re.escape(message)):
        RuleSpec.parse("sa", options)
