"""GEM: the worker pushes π ⊙ Δ, π = clamp((κ|m| − |θ − s|) ⊘ (|Δ| + ε), 0, π_max); the server adds it."""

from __future__ import annotations

import re

import pytest
import torch

from psserver.core.rules import PayloadKind, RuleOptionError, RuleSpec
from psserver.core.rules.gem import NO_RESERVATION, Reservation
from tests.psserver.core.rules.conftest import INITIAL, Cluster, Worker

GA = torch.tensor([1.0, 2.0, -1.0, 0.5, 3.0, 4.0])
GB = torch.tensor([-3.0, 1.0, 2.0, 2.0, 1.0, -1.0])


def test_first_commit_has_pi_kappa_and_the_next_one_is_matched_to_it() -> None:
    kappa, lr = 2.0, 0.1
    cluster = Cluster("gem", lr=str(lr), kappa=str(kappa), momentum="0.9")
    a, b = Worker(cluster, "a"), Worker(cluster, "b")  # both computed on the initial θ
    a.step(GA)
    delta_a = -lr * GA
    theta1 = INITIAL + kappa * delta_a  # nobody else committed: π = κ
    torch.testing.assert_close(cluster.params, theta1)
    assert cluster.shard.workers[a.client.worker_id].last_telemetry["scale"] == pytest.approx(kappa)

    b.step(GB)
    delta_b = -lr * GB
    pi = ((kappa * delta_b.abs() - (theta1 - INITIAL).abs()) / (delta_b.abs() + 1e-12)).clamp(0.0, 5.0)
    assert (pi == 0).any() and (pi > 0).any()  # the example exercises the clamp
    torch.testing.assert_close(cluster.params, theta1 + pi * delta_b)
    assert cluster.shard.workers[b.client.worker_id].last_telemetry["scale"] == pytest.approx(float(pi.median()))


def test_the_server_adds_deltas_and_reports_the_workers_median_pi() -> None:
    cluster = Cluster("gem")
    a, b = cluster.join("a"), cluster.join("b")
    cluster.pull_each(a, b)
    cluster.push(a, GA, PayloadKind.DELTA, {"pi_median": 0.75})
    stale = cluster.push(b, GB, PayloadKind.DELTA)
    torch.testing.assert_close(cluster.params, INITIAL + GA + GB)
    assert cluster.shard.workers[a].last_telemetry["scale"] == 0.75
    assert "scale" not in stale.telemetry


def test_procedure_options_carry_every_option() -> None:
    cluster = Cluster("gem", atomic="false", kappa="2")
    worker = Worker(cluster, "a")
    assert worker.client.rule.procedure_options == {
        "lr": "0.05",
        "momentum": "0.9",
        "kappa": "2.0",
        "pi_max": "5.0",
        "epsilon": "1e-12",
        "local_apply": "true",
        "atomic": "false",
    }


def test_momentum_of_one_is_refused() -> None:
    with pytest.raises(RuleOptionError, match=re.escape("option momentum=1.0 is out of range: 0 <= value < 1")):
        RuleSpec.parse("gem", {"momentum": "1"})


def test_a_reservation_admits_its_holder_only_until_it_lapses() -> None:
    held = NO_RESERVATION.taken_by(1, now=10.0, seconds=5.0)
    assert held == Reservation(1, 15.0)
    assert held.admits(1, 12.0) and not held.admits(2, 12.0)
    assert held.holder_at(15.0) == 1 and held.holder_at(15.1) is None
    assert held.admits(2, 15.1)


def test_pulling_again_does_not_extend_a_reservation_but_a_lapsed_one_is_taken_anew() -> None:
    held = NO_RESERVATION.taken_by(1, now=10.0, seconds=5.0)
    assert held.taken_by(1, now=14.0, seconds=5.0) is held
    assert held.taken_by(1, now=16.0, seconds=5.0) == Reservation(1, 21.0)
    assert held.taken_by(2, now=16.0, seconds=5.0) == Reservation(2, 21.0)


def test_only_the_holder_releases_a_reservation() -> None:
    held = Reservation(1, 15.0)
    assert held.released_by(2) is held
    assert held.released_by(1) is NO_RESERVATION


def test_only_atomic_gem_takes_exclusive_pulls() -> None:
    assert RuleSpec.parse("gem", {}).build(4).exclusive_pull_refusal() is None
    refusal = RuleSpec.parse("gem", {"atomic": "false"}).build(4).exclusive_pull_refusal()
    assert refusal == "rule gem with these options takes no exclusive pulls; pull without one"
