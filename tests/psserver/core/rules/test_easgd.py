"""Asynchronous EASGD / EAMSGD: the worker pushes E = α (x − x̃), the server adds it to the centre."""

from __future__ import annotations

import re

import pytest
import torch

from psserver.core.errors import ErrorKind, ShardError
from psserver.core.rules import PayloadKind, RuleOptionError, RuleSpec
from tests.psserver.core.rules.conftest import INITIAL, Cluster, Worker

GA = torch.tensor([1.0, 2.0, -1.0, 0.5, 0.0, 4.0])
GB = torch.tensor([-3.0, 1.0, 2.0, 2.0, 1.0, -1.0])
GA2 = torch.tensor([0.5, -0.5, 1.0, 0.0, -2.0, 1.0])


def test_two_workers_exchange_elastic_differences_with_the_centre() -> None:
    lr, rho = 0.1, 2.0
    alpha = lr * rho
    cluster = Cluster("easgd", lr=str(lr), rho=str(rho), window="1")
    a, b = Worker(cluster, "a"), Worker(cluster, "b")  # both start from the initial centre
    a.step(GA)
    b.step(GB)
    a.step(GA2)

    x_a = INITIAL - lr * GA
    elastic = alpha * (x_a - INITIAL)
    centre = INITIAL + elastic
    x_a = x_a - elastic
    x_b = INITIAL - lr * GB  # b never saw a's exchange in its local model
    elastic = alpha * (x_b - centre)
    centre = centre + elastic
    x_b = x_b - elastic
    x_a = x_a - lr * GA2
    elastic = alpha * (x_a - centre)
    centre = centre + elastic
    x_a = x_a - elastic

    torch.testing.assert_close(cluster.params, centre)
    torch.testing.assert_close(a.local, x_a)
    torch.testing.assert_close(b.local, x_b)


def test_the_centre_only_moves_every_window() -> None:
    cluster = Cluster("easgd", lr="0.1", rho="2", window="2")
    worker = Worker(cluster, "a")
    worker.step(GA)
    torch.testing.assert_close(cluster.params, INITIAL)
    worker.step(GB)
    x = INITIAL - 0.1 * GA - 0.1 * GB
    torch.testing.assert_close(cluster.params, INITIAL + 0.2 * (x - INITIAL))


def test_eamsgd_takes_nesterov_steps_locally() -> None:
    cluster = Cluster("eamsgd", lr="0.1", rho="2", window="1")
    assert cluster.shard.config.rule.options.as_strings()["local_momentum"] == "0.9"
    worker = Worker(cluster, "a")
    worker.step(GA)
    x = INITIAL - 0.1 * (GA + 0.9 * GA)  # Nesterov's first step: g + δ buf, buf = g
    torch.testing.assert_close(cluster.params, INITIAL + 0.2 * (x - INITIAL))


def test_stale_deltas_are_added_as_they_are_and_gradients_refused() -> None:
    cluster = Cluster("easgd")
    a, b = cluster.join("a"), cluster.join("b")
    cluster.pull_each(a, b)
    cluster.push(a, GA, PayloadKind.DELTA)
    stale = cluster.push(b, GB, PayloadKind.DELTA)
    torch.testing.assert_close(cluster.params, INITIAL + GA + GB)
    assert stale.staleness == 1
    with pytest.raises(ShardError) as refused:
        cluster.push(a, GA, PayloadKind.GRADIENT)
    assert refused.value.kind is ErrorKind.BAD_REQUEST


@pytest.mark.parametrize(
    ("rule", "options", "message"),
    [
        ("easgd", {"lr": "0.5", "rho": "5"}, "moving rate alpha = lr * rho = 2.5 must be at most 1"),
        ("eamsgd", {"local_momentum": "1"}, "option local_momentum=1.0 is out of range: 0 <= value < 1"),
        ("easgd", {"rho": "0"}, "option rho=0 is out of range: value > 0.0"),
    ],
)
def test_invalid_options_are_refused(rule: str, options: dict[str, str], message: str) -> None:
    with pytest.raises(RuleOptionError, match=re.escape(message)):
        RuleSpec.parse(rule, options)
