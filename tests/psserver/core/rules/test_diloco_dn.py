"""Delayed Nesterov (Algorithm 3): momentum once every N pushes, every push at ε/N, c μ m between."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from psproto import codec
from psserver.cli import main
from psserver.core import checkpoint
from psserver.core.rules import PayloadKind, RuleOptionError, RuleSpec
from psserver.core.shard import PushHeader, Shard, ShardConfig
from psserver.core.workers import PushOutcome
from tests.psserver.core.rules.conftest import INITIAL, LAYOUT, Cluster, Worker

G1 = torch.tensor([1.0, 2.0, -1.0, 0.5, 0.0, 4.0])
G2 = torch.tensor([-3.0, 1.0, 2.0, 2.0, 1.0, -1.0])
G3 = torch.tensor([0.5, -0.5, 1.0, 0.0, -2.0, 1.0])
DELTAS = [G1, -G2, G3, 0.5 * G2, -G1, G2 - G3]


def test_three_pushes_over_a_period_of_two() -> None:
    """Written from the equations with ε = 0.5, μ = 0.5, N = 2, c = 0.25; g = −Δ."""
    cluster = Cluster("diloco-dn", lr="0.5", momentum="0.5", period="2", c="0.25")
    a, b = cluster.join("a"), cluster.join("b")
    cluster.pull_each(a, b)
    outcomes = [cluster.push(a, -G1, PayloadKind.DELTA)]  # g = G1 at t = 0
    outcomes.append(cluster.push(b, -G2, PayloadKind.DELTA))  # t = 1 closes the period
    cluster.pull(a)
    outcomes.append(cluster.push(a, -G3, PayloadKind.DELTA))  # t = 2 opens the next

    theta1 = INITIAL - 0.5 * (0.25 * 0.5 * 0 + G1 / 2)  # m is still 0
    m1 = 0.5 * 0 + (G1 + G2) / 2
    theta2 = theta1 - 0.5 * ((1 - 0.25 * 2 + 0.25) * 0.5 * m1 + G2 / 2)
    theta3 = theta2 - 0.5 * (0.25 * 0.5 * m1 + G3 / 2)
    torch.testing.assert_close(cluster.params, theta3)
    state = cluster.shard.rule.state_tensors()  # type: ignore[union-attr]
    torch.testing.assert_close(state["momentum"], m1)
    torch.testing.assert_close(state["accumulator"], G3)
    assert [o.telemetry["momentum_step"] for o in outcomes] == [0.0, 1.0, 0.0]
    assert all(o.telemetry["scale"] == 1.0 for o in outcomes)
    assert outcomes[1].staleness == 1


def _pushed(rule: str, **options: str) -> torch.Tensor:
    cluster = Cluster(rule, lr="0.7", momentum="0.9", **options)
    a, b = cluster.join("a"), cluster.join("b")
    cluster.pull_each(a, b)
    for index, delta in enumerate(DELTAS):
        cluster.push(a if index % 2 else b, delta, PayloadKind.DELTA)
    return cluster.params.clone()


def test_a_period_of_one_is_diloco() -> None:
    torch.testing.assert_close(_pushed("diloco-dn", period="1"), _pushed("diloco"), rtol=0, atol=0)
    # With N = 1 the share c cancels out: (1 − cN + c) = 1.
    torch.testing.assert_close(_pushed("diloco-dn", period="1", c="0.5"), _pushed("diloco"))


def _shard() -> Shard:
    return Shard(ShardConfig(RuleSpec.parse("diloco-dn", {"lr": "0.7", "momentum": "0.9", "period": "3", "c": "0.2"})))


def _push(shard: Shard, worker_id: int, push_id: int, delta: torch.Tensor) -> PushOutcome:
    return shard.push(
        PushHeader(worker_id, push_id, shard.workers[worker_id].pulled_clock, int(PayloadKind.DELTA), LAYOUT.hash, {}),
        codec.encode(delta),
    )


def test_restored_mid_period_it_continues_exactly(tmp_path: Path) -> None:
    """Four pushes (one period of three and one push into the next), a checkpoint, two more."""
    running = _shard()
    worker = running.join("a", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    assembler = running.begin_upload(worker, LAYOUT.hash)
    for chunk in codec.encode(INITIAL):
        running.decode_chunk(assembler, chunk)
    running.finish_upload(assembler)
    for push_id, delta in enumerate(DELTAS[:4], start=1):
        _push(running, worker, push_id, delta)
    assert running.rule is not None and running.rule.state_tensors()["accumulator"].abs().sum() > 0
    checkpoint.write_checkpoint(tmp_path, running.state_dict(), keep=3)  # read back with weights_only

    restored = _shard()
    assert checkpoint.restore(restored, tmp_path) is not None
    assert restored.clock == 4
    after_restart = [_push(restored, worker, push_id, delta) for push_id, delta in enumerate(DELTAS[4:], start=5)]
    uninterrupted = [_push(running, worker, push_id, delta) for push_id, delta in enumerate(DELTAS[4:], start=5)]

    assert [o.telemetry["momentum_step"] for o in after_restart] == [0.0, 1.0]  # t = 5 closes the second period
    assert [o.telemetry for o in after_restart] == [o.telemetry for o in uninterrupted]
    torch.testing.assert_close(restored.params, running.params, rtol=0, atol=0)
    assert restored.rule is not None
    for name, tensor in running.rule.state_tensors().items():
        torch.testing.assert_close(restored.rule.state_tensors()[name], tensor, rtol=0, atol=0)


def test_the_worker_runs_the_diloco_procedure() -> None:
    cluster = Cluster("diloco-dn", period="2", window="3")
    worker = Worker(cluster, "a")
    assert worker.client.rule.worker_procedure == "diloco"
    assert worker.client.rule.procedure_options["window"] == "3"
    assert worker.client.rule.procedure_options["local_lr"] == "0.05"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"c": "0.3"}, r"option c=0.3 is out of range: 0 <= c <= 1/period = 0.25 \(period=4\)"),
        ({"period": "2", "c": "0.75"}, r"option c=0.75 is out of range: 0 <= c <= 1/period = 0.5 \(period=2\)"),
        ({"c": "-0.1"}, "option c=-0.1 is out of range: value >= 0.0"),
        ({"period": "0"}, "option period=0 is out of range: value >= 1"),
        ({"period": "two"}, "option period='two' is not a valid int"),
        ({"momentum": "1"}, "option momentum=1.0 is out of range: 0 <= value < 1"),
        ({"nesterov": "false"}, "unknown option nesterov"),
    ],
)
def test_bad_options_are_refused(options: dict[str, str], message: str) -> None:
    with pytest.raises(RuleOptionError, match=message):
        RuleSpec.parse("diloco-dn", options)


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        (["c=0.5"], "option c=0.5 is out of range: 0 <= c <= 1/period = 0.25 (period=4)"),
        (["period=0"], "option period=0 is out of range: value >= 1"),
    ],
)
def test_psserver_serve_exits_2_on_a_bad_option(opts: list[str], message: str) -> None:
    args = ["serve", "--port", "0", "--rule", "diloco-dn"]
    for opt in opts:
        args += ["--rule-opt", opt]
    result = CliRunner().invoke(main, args, terminal_width=200)
    assert result.exit_code == 2, result.output
    assert message in result.output
