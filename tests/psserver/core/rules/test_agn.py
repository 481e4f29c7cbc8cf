"""AGN: the worker pushes its window's accumulated delta divided by the steps; the server adds it."""

from __future__ import annotations

import torch

from psserver.core.rules import PayloadKind
from tests.psserver.core.rules.conftest import INITIAL, Cluster, Worker

G1 = torch.tensor([1.0, 2.0, -1.0, 0.5, 0.0, 4.0])
G2 = torch.tensor([-3.0, 1.0, 2.0, 2.0, 1.0, -1.0])
G3 = torch.tensor([0.5, -0.5, 1.0, 0.0, -2.0, 1.0])


def test_two_workers_push_normalised_windows() -> None:
    cluster = Cluster("agn", lr="0.1", window="2", local_optimizer="sgd")
    a, b = Worker(cluster, "a"), Worker(cluster, "b")
    a.step(G1)
    a.step(G2)
    theta1 = INITIAL + (-0.1 * G1 - 0.1 * G2) / 2
    torch.testing.assert_close(cluster.params, theta1)
    torch.testing.assert_close(a.local, theta1)  # the worker takes the centre after pushing
    b.step(G3)
    b.finish()  # a partial window of one step is divided by one
    torch.testing.assert_close(cluster.params, theta1 - 0.1 * G3)


def test_the_default_local_optimizer_is_adam() -> None:
    cluster = Cluster("agn")
    worker = Worker(cluster, "a")
    assert worker.client.rule.procedure_options == {"lr": "0.001", "window": "12", "local_optimizer": "adam"}
    assert isinstance(getattr(worker.procedure, "optimizer", None), torch.optim.Adam)


def run(rule: str) -> torch.Tensor:
    cluster = Cluster(rule, lr="0.1", window="1", **({"local_optimizer": "sgd"} if rule == "agn" else {}))
    a, b = Worker(cluster, "a"), Worker(cluster, "b")
    for worker, gradient in ((a, G1), (b, G2), (b, G3), (a, -G2)):
        worker.step(gradient)
    return cluster.params.clone()


def test_a_window_of_one_is_downpour() -> None:
    agn = run("agn")
    torch.testing.assert_close(agn, run("downpour"), rtol=0, atol=0)
    torch.testing.assert_close(agn, INITIAL - 0.1 * (G1 + G2 + G3 - G2))


def test_deltas_are_added_whatever_their_staleness() -> None:
    cluster = Cluster("agn")
    a, b = cluster.join("a"), cluster.join("b")
    cluster.pull_each(a, b)
    cluster.push(a, G1, PayloadKind.DELTA)
    stale = cluster.push(b, G2, PayloadKind.DELTA)
    torch.testing.assert_close(cluster.params, INITIAL + G1 + G2)
    assert stale.staleness == 1 and stale.telemetry["scale"] == 1.0
