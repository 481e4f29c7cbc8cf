"""OrMo: gradients enter momentum by the iteration they were computed at, not by arrival.

u ← u + β^d η g ;  w ← w − ((1 − β^{d+1}) / (1 − β)) η g ;  on advance: w ← w − β u ; u ← β u ; I ← I + 1
"""

from __future__ import annotations

import random
import re

import pytest
import torch

from psserver.core.rules import PayloadKind, PushContext, RuleOptionError, RuleSpec, UpdateRule, _kernels
from psserver.core.rules.options import RuleOptions
from tests.psserver.core.rules.conftest import INITIAL, Cluster, apply, build_rule, context

G1 = torch.tensor([1.0, 2.0, -1.0, 0.5, 0.0, 4.0])
G2 = torch.tensor([-3.0, 1.0, 2.0, 2.0, 1.0, -1.0])
G3 = torch.tensor([0.5, -0.5, 1.0, 0.0, -2.0, 1.0])
# Powers of two keep every product and sum exact in fp32, so orders can be compared bit for bit.
BETA, LR = 0.5, 0.25


def test_hand_computed_two_workers() -> None:
    cluster = Cluster("ormo", lr=str(LR), beta=str(BETA))
    a, b = cluster.join("a"), cluster.join("b")
    cluster.pull_each(a, b)  # both tagged with iteration 0
    first = cluster.push(a, G1)  # d = 0: opens iteration 1
    u = LR * G1
    w = INITIAL - LR * G1
    w, u = w - BETA * u, BETA * u
    second = cluster.push(b, G2)  # tag 0 at iteration 1: d = 1
    u = u + BETA * LR * G2
    w = w - (1 + BETA) * LR * G2
    cluster.pull(b)  # tag 1
    third = cluster.push(b, G3)  # d = 0: opens iteration 2
    u = u + LR * G3
    w = w - LR * G3
    w, u = w - BETA * u, BETA * u

    torch.testing.assert_close(cluster.params, w)
    torch.testing.assert_close(cluster.shard.rule.state_tensors()["momentum"], u)  # type: ignore[union-attr]
    assert [first.telemetry["lag"], second.telemetry["lag"], third.telemetry["lag"]] == [0.0, 1.0, 0.0]
    assert [first.telemetry["iteration"], second.telemetry["iteration"], third.telemetry["iteration"]] == [1, 1, 2]


def gradient(tag: int, worker: int) -> torch.Tensor:
    """The fixed gradient of a worker at an iteration: small integers, independent of w."""
    return torch.tensor([tag + worker, 1.0 - worker, 2.0 * tag - 3, (worker * tag) % 3, -1.0, tag % 2])


def iteration(rule: UpdateRule[RuleOptions]) -> int:
    return int(rule.state_tensors()["iteration"])


def synchronous(pushed: list[tuple[int, int]], iterations: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Momentum SGD, one step per iteration with the sum of that iteration's gradients: (w_T, m_T)."""
    w, m = INITIAL.double(), torch.zeros(6, dtype=torch.float64)
    for t in range(iterations):
        m = BETA * m + sum((gradient(tag, worker).double() for tag, worker in pushed if tag == t), torch.zeros(6))
        w = w - LR * m
    return w, m


def check_against_synchronous(
    rule: UpdateRule[RuleOptions], params: torch.Tensor, pushed: list[tuple[int, int]]
) -> None:
    """All pushed gradients are of iterations < I: w + u is synchronous w_I, and w its look-ahead w_I − ηβ m_I."""
    iterations = iteration(rule)
    assert all(tag < iterations for tag, _ in pushed)
    w_sync, m_sync = synchronous(pushed, iterations)
    momentum = rule.state_tensors()["momentum"]
    torch.testing.assert_close(params + momentum, w_sync.float())
    torch.testing.assert_close(params, (w_sync - LR * BETA * m_sync).float())


# Each script is an admissible order of pulls and pushes of workers 0 and 1 that computes the same
# gradients: both workers at iterations 0 and 1.
SCRIPTS = {
    "worker 0 first": "pull0 pull1 push0 push1 pull0 pull1 push0 push1",
    "worker 1 first": "pull0 pull1 push1 push0 pull1 pull0 push1 push0",
    "interleaved": "pull0 pull1 push0 pull0 push1 pull1 push1 push0",
}


def run_script(rule: UpdateRule[RuleOptions], script: str) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    params = INITIAL.clone()
    tags: dict[int, int] = {}
    pushed = []
    for event in script.split():
        worker = int(event[-1])
        if event.startswith("pull"):
            rule.on_pull(worker)
            tags[worker] = iteration(rule)
        else:
            tag = tags.pop(worker)
            apply(rule, params, gradient(tag, worker), context(worker_id=worker))
            pushed.append((tag, worker))
    return params, pushed


def test_every_admissible_order_gives_synchronous_momentum_sgd_exactly() -> None:
    results = []
    for script in SCRIPTS.values():
        rule = build_rule("ormo", lr=str(LR), beta=str(BETA))
        params, pushed = run_script(rule, script)
        assert sorted(pushed) == [(0, 0), (0, 1), (1, 0), (1, 1)]
        check_against_synchronous(rule, params, pushed)
        results.append(params)
    for other in results[1:]:
        torch.testing.assert_close(other, results[0], rtol=0, atol=0)


@pytest.mark.parametrize("advance", ["fresh", "every_k"])
@pytest.mark.parametrize("seed", range(4))
def test_random_orders_with_uneven_workers_match_the_synchronous_run(advance: str, seed: int) -> None:
    """Three workers, one much slower, so lags of several iterations occur."""
    rule = build_rule("ormo", lr=str(LR), beta=str(BETA), advance=advance, k="3")
    pick = random.Random(seed)
    params = INITIAL.clone()
    tags: dict[int, int] = {}
    pushed: list[tuple[int, int]] = []
    lags = []
    while len(pushed) < 24:
        worker = pick.choices(range(3), weights=(5, 3, 1))[0]
        if worker not in tags:
            rule.on_pull(worker)
            tags[worker] = iteration(rule)
            continue
        tag = tags.pop(worker)
        lags.append(apply(rule, params, gradient(tag, worker), context(worker_id=worker))["lag"])
        pushed.append((tag, worker))
    assert max(lags) >= (2 if advance == "fresh" else 1)
    check_against_synchronous(rule, params, pushed)


def test_beta_one_counts_every_missed_step() -> None:
    rule = build_rule("ormo", lr="0.5", beta="1")
    params = INITIAL.clone()
    rule.on_pull(1)
    rule.on_pull(2)
    apply(rule, params, G1, context(worker_id=1))  # d = 0: w −= η g1, then w −= u = η g1
    telemetry = apply(rule, params, G2, context(worker_id=2))  # d = 1: two missed steps
    torch.testing.assert_close(params, INITIAL - 2 * 0.5 * G1 - 2 * 0.5 * G2)
    torch.testing.assert_close(rule.state_tensors()["momentum"], 0.5 * G1 + 0.5 * G2)
    assert telemetry["lag"] == 1.0


def test_a_worker_without_a_tag_or_with_one_from_the_future_is_fresh() -> None:
    rule = build_rule("ormo", lr=str(LR), beta=str(BETA))
    params = INITIAL.clone()
    assert apply(rule, params, G1, context(worker_id=7))["lag"] == 0.0  # never pulled
    rule.on_pull(1)
    apply(rule, params, G2, context(worker_id=8))
    assert iteration(rule) == 2
    rule.state_tensors()["iteration"].zero_()  # restored from an older checkpoint
    telemetry = apply(rule, params, G3, context(worker_id=1))  # tag 1 > I = 0
    assert (telemetry["lag"], telemetry["iteration"]) == (0.0, 1.0)


def test_a_worker_that_left_comes_back_fresh() -> None:
    rule = build_rule("ormo", lr=str(LR), beta=str(BETA))
    params = INITIAL.clone()
    rule.on_pull(1)
    rule.on_pull(2)
    apply(rule, params, G1, context(worker_id=2))
    rule.on_pull(3)
    assert apply(rule, params, G2, context(worker_id=3))["iteration"] == 2.0
    rule.on_leave(1)  # its tag 0 is forgotten, not held against it as a lag of 2
    assert apply(rule, params, G3, context(worker_id=1))["lag"] == 0.0


def test_every_k_advances_after_k_gradients_whatever_their_lag() -> None:
    rule = build_rule("ormo", lr=str(LR), beta=str(BETA), advance="every_k", k="2")
    params = INITIAL.clone()
    rule.on_pull(1)
    rule.on_pull(2)
    assert apply(rule, params, G1, context(worker_id=1))["iteration"] == 0.0
    assert apply(rule, params, G2, context(worker_id=2))["iteration"] == 1.0
    w = INITIAL - LR * G1 - LR * G2
    u = LR * (G1 + G2)
    torch.testing.assert_close(params, w - BETA * u)


def test_ormo_da_scales_eta_by_k_over_tau() -> None:
    cluster = Cluster("ormo-da", lr=str(LR), beta=str(BETA), k="2")
    a, b = cluster.join("a"), cluster.join("b")
    cluster.pull_each(a, b)
    for _ in range(4):
        assert cluster.push(a, G1).telemetry["scale"] == 1.0
        cluster.pull(a)
    rule = cluster.shard.rule
    assert rule is not None
    w, u = cluster.params.clone(), rule.state_tensors()["momentum"].clone()
    stale = cluster.push(b, G2)  # τ = 4, d = 4: η × min(1, 2/4)
    lr = LR * 0.5
    u = u + BETA**4 * lr * G2
    w = w - (1 - BETA**5) / (1 - BETA) * lr * G2
    torch.testing.assert_close(cluster.params, w)
    torch.testing.assert_close(rule.state_tensors()["momentum"], u)
    assert (stale.telemetry["scale"], stale.telemetry["lag"], stale.staleness) == (0.5, 4.0, 4)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"advance": "always"}, "option advance='always' must be one of fresh, every_k"),
        ({"k": "0"}, "option k=0 is out of range: value >= 1"),
        ({"beta": "1.1"}, "option beta=1.1 is out of range"),
    ],
)
def test_invalid_options_are_refused(options: dict[str, str], message: str) -> None:
    with pytest.raises(RuleOptionError, match=re.escape(message)):
        RuleSpec.parse("ormo-da", options)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize(
    ("name", "beta", "advance"),
    [("ormo", 0.9, "fresh"), ("ormo", 1.0, "every_k"), ("ormo-da", 0.5, "every_k"), ("ormo", 0.0, "fresh")],
)
def test_blocked_apply_matches_the_formula_on_random_data(
    name: str, beta: float, advance: str, fused: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random pushes from three workers at random lags, over blocks of 128, fused kernel or op by op."""
    monkeypatch.setattr(_kernels, "BLOCK", 128)
    if not fused:
        monkeypatch.setattr(_kernels, "_FUSED_SGD", None)
    lr, k, length = 0.05, 2, 1000
    options = {"lr": str(lr), "beta": str(beta), "advance": advance, "k": str(k)}
    rule = RuleSpec.parse(name, options).build(length)
    generator = torch.Generator().manual_seed(13)
    params = torch.randn(length, generator=generator)
    w, u = params.double(), torch.zeros(length, dtype=torch.float64)
    iteration, arrivals, tags, lags = 0, 0, {}, set()
    choices = random.Random(4)
    for _ in range(12):
        worker = choices.choice((1, 2, 3))
        if worker not in tags or choices.random() < 0.5:
            rule.on_pull(worker)
            tags[worker] = iteration
        staleness = choices.choice((0, 1, 3, 8))
        gradient = torch.randn(length, generator=generator)
        telemetry = rule.apply(params, gradient.clone(), PushContext(worker, staleness, PayloadKind.GRADIENT, ()))

        lag = iteration - tags[worker]
        lags.add(lag)
        scale = min(1.0, k / staleness) if name == "ormo-da" and staleness > 0 else 1.0
        eta = lr * scale
        missed = lag + 1 if beta == 1.0 else (1 - beta ** (lag + 1)) / (1 - beta)
        u = u + beta**lag * eta * gradient.double()
        w = w - missed * eta * gradient.double()
        arrivals += 1
        if (lag == 0) if advance == "fresh" else arrivals >= k:
            w = w - beta * u
            u = beta * u
            iteration += 1
            arrivals = 0
        torch.testing.assert_close(params, w.float(), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(rule.state_tensors()["momentum"], u.float(), rtol=1e-5, atol=1e-6)
        assert telemetry == {"lag": float(lag), "iteration": float(iteration), "scale": scale}
    assert len(lags) > 2  # fresh and several stale lags
