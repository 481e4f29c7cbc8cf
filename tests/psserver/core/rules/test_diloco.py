"""DiLoCo's outer Nesterov on the pseudo-gradient g = −Δ: m ← μ m + g ; θ ← θ − ε (g + μ m)."""

from __future__ import annotations

import threading

import pytest
import torch

from psserver.core.consistency import Consistency, ConsistencyModel
from psserver.core.errors import ErrorKind, ShardError
from psserver.core.rules import PayloadKind, RuleOptionError, RuleSpec
from psserver.core.shard import Shard, ShardConfig
from psserver.core.workers import PushOutcome
from tests.psserver.core.rules.conftest import INITIAL, Cluster, Worker

D1 = torch.tensor([0.25, 0.0, -0.5, 1.0, 2.0, 0.0])
D2 = torch.tensor([-1.0, 0.5, 0.5, 0.0, -0.25, 1.0])
G1 = torch.tensor([1.0, 2.0, -1.0, 0.5, 0.0, 4.0])
G2 = torch.tensor([-3.0, 1.0, 2.0, 2.0, 1.0, -1.0])
G3 = torch.tensor([0.5, -0.5, 1.0, 0.0, -2.0, 1.0])


def test_two_pushes_from_two_workers_take_two_nesterov_steps() -> None:
    cluster = Cluster("diloco", lr="0.5", momentum="0.5")
    a, b = cluster.join("a"), cluster.join("b")
    cluster.pull_each(a, b)
    first = cluster.push(a, D1, PayloadKind.DELTA)
    stale = cluster.push(b, D2, PayloadKind.DELTA)

    g1, g2 = -D1, -D2
    m1 = g1
    theta1 = INITIAL - 0.5 * (g1 + 0.5 * m1)
    m2 = 0.5 * m1 + g2
    theta2 = theta1 - 0.5 * (g2 + 0.5 * m2)
    torch.testing.assert_close(cluster.params, theta2)
    torch.testing.assert_close(cluster.shard.rule.state_tensors()["momentum"], m2)  # type: ignore[union-attr]
    assert first.telemetry["scale"] == 1.0 and stale.staleness == 1 and stale.telemetry["scale"] == 1.0


def test_without_nesterov_the_step_is_the_momentum() -> None:
    cluster = Cluster("diloco", lr="0.5", momentum="0.5", nesterov="false")
    a = cluster.join()
    cluster.pull(a)
    cluster.push(a, D1, PayloadKind.DELTA)
    cluster.push(a, D2, PayloadKind.DELTA)
    m1 = -D1
    m2 = 0.5 * m1 - D2
    torch.testing.assert_close(cluster.params, INITIAL - 0.5 * m1 - 0.5 * m2)


def _run_windows(rule: str, **options: str) -> torch.Tensor:
    cluster = Cluster(rule, window="2", **options)
    a, b = Worker(cluster, "a"), Worker(cluster, "b")
    for worker, gradient in ((a, G1), (b, G2), (a, G2), (b, G3), (b, -G1), (a, G3)):
        worker.step(gradient)
    b.finish()  # the partial windows of one step
    a.finish()
    return cluster.params.clone()


def test_no_momentum_and_an_outer_rate_of_one_is_downpour() -> None:
    diloco = _run_windows("diloco", lr="1", momentum="0", local_lr="0.1")
    torch.testing.assert_close(diloco, _run_windows("downpour", lr="0.1"), rtol=0, atol=0)
    # a's window (G1, G2), b's (G2, G3), then the partial ones, b's (−G1) and a's (G3).
    torch.testing.assert_close(diloco, INITIAL - 0.1 * (G1 + G2 + G2 + G3 - G1 + G3))


class BspCluster(Cluster):
    """A cluster whose shard runs ``--consistency bsp``."""

    def __init__(self, rule: str, **options: str) -> None:
        super().__init__(rule, **options)
        config = ShardConfig(RuleSpec.parse(rule, options), consistency=Consistency(ConsistencyModel.BSP))
        self.shard = Shard(config)


def _bsp_round(cluster: Cluster, a: int, b: int, first: torch.Tensor, second: torch.Tensor) -> None:
    """``a`` pushes first and waits (on a thread) until ``b``'s push completes the round."""
    cluster.pull_each(a, b)
    results: list[PushOutcome] = []
    waiting = threading.Thread(target=lambda: results.append(cluster.push(a, first, PayloadKind.DELTA)))
    waiting.start()
    try:
        waiting.join(0.2)
        assert waiting.is_alive()  # a waits for b's push
        last = cluster.push(b, second, PayloadKind.DELTA)
    finally:
        waiting.join(5)
    assert not waiting.is_alive() and results[0].clock == last.clock


def test_under_bsp_the_rounds_pushes_are_averaged_first() -> None:
    """Synchronous DiLoCo: one outer step per round on the mean pseudo-gradient."""
    cluster = BspCluster("diloco", lr="0.5", momentum="0.5")
    a, b = cluster.join("a"), cluster.join("b")
    _bsp_round(cluster, a, b, D1, D2)
    _bsp_round(cluster, a, b, D2, -D1)
    assert cluster.shard.clock == 2 and cluster.shard.applied_pushes == 2

    g1, g2 = -(D1 + D2) / 2, -(D2 - D1) / 2
    m1 = g1
    theta1 = INITIAL - 0.5 * (g1 + 0.5 * m1)
    m2 = 0.5 * m1 + g2
    torch.testing.assert_close(cluster.params, theta1 - 0.5 * (g2 + 0.5 * m2))


def test_gradients_are_refused() -> None:
    cluster = Cluster("diloco")
    a = cluster.join()
    cluster.pull(a)
    with pytest.raises(ShardError) as refused:
        cluster.push(a, G1, PayloadKind.GRADIENT)
    assert refused.value.kind is ErrorKind.BAD_REQUEST
    assert "worker procedure 'diloco'" in refused.value.message
    torch.testing.assert_close(cluster.params, INITIAL)


def test_defaults_and_what_the_worker_is_sent() -> None:
    cluster = Cluster("diloco")
    worker = Worker(cluster, "a")
    assert worker.client.rule.worker_procedure == "diloco"
    assert worker.client.rule.procedure_options == {
        "lr": "0.7",
        "momentum": "0.9",
        "window": "20",
        "local_lr": "0.05",
        "nesterov": "true",
    }
    assert isinstance(getattr(worker.procedure, "optimizer", None), torch.optim.SGD)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"momentum": "1"}, "option momentum=1.0 is out of range: 0 <= value < 1"),
        ({"momentum": "-0.1"}, "option momentum=-0.1 is out of range"),
        ({"window": "0"}, "option window=0 is out of range: value >= 1"),
        ({"lr": "0"}, "option lr=0 is out of range: value > 0"),
        ({"local_lr": "0"}, "option local_lr=0 is out of range: value > 0"),
        ({"nesterov": "maybe"}, "option nesterov='maybe' is not a valid bool"),
        ({"period": "4"}, "unknown option period"),
    ],
)
def test_bad_options_are_refused(options: dict[str, str], message: str) -> None:
    with pytest.raises(RuleOptionError, match=message):
        RuleSpec.parse("diloco", options)
