"""Every rule and consistency model trains the digits CNN through the local cluster: 4 workers, speeds 1:1:2:4.

Learning rates are chosen per rule (windowed rules take a local rate and push every 4 local
steps); the bar is the issue's 0.85 test accuracy, reached in a few hundred updates. A rule given
fewer than 400 updates of 4 steps or 600 of one has at least 1.3 times the update from which every
evaluation of every worker stayed at or above 0.90, in a run with ``eval_every`` 5 on a host loaded
four to ten times over its 2 cores (staler pushes than CI's), and ended at 0.936 or more in a run of
this module on that host. (``sa`` at 700 updates ended at 0.883 there, ``downpour`` at 300 at 0.911:
too near the bar, so they keep 1,000 and 400.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from psserver.core.rules import RULES
from pstools.launcher import ClusterConfig, run_cluster

pytestmark = pytest.mark.integration

# rule -> (lr, rule options, updates, extra server arguments)
CONFIGS: dict[str, tuple[float, tuple[str, ...], int, tuple[str, ...]]] = {
    # At lr 0.1 over 600 updates a CI run ended at 0.800, below the bar, though such dips are rare
    # (`python -m benchmarks.cluster_spread --rule asgd --lr 0.1 --updates 600 --runs 8`: 0.931–0.969).
    # The same at lr 0.05 over 1000 updates: 0.950–0.975, a wider margin for the bar.
    "asgd": (0.05, (), 1000, ()),
    # At lr 0.03 over 600 updates a CI run ended at 0.758, though 6 runs of `python -m
    # benchmarks.cluster_spread --rule momentum --lr 0.03 --rule-opt momentum=0.7 --updates 600
    # --runs 6` gave 0.928-0.961; at lr 0.02 over 1000 updates 6 runs gave 0.953-0.969.
    "momentum": (0.02, ("momentum=0.7",), 1000, ()),
    # At lr 0.2 over 600 updates a run beside other test runs ended at 0.839 (mean staleness 6.7);
    # `python -m benchmarks.cluster_spread --rule sa --lr 0.2 --updates 600 --runs 6`: 0.942-0.972,
    # and at lr 0.1 over 1000 updates 0.942-0.978: the smaller rate is hurt less by stale pushes.
    "sa": (0.1, (), 1000, ()),
    "dynsgd": (0.05, ("window=4",), 400, ()),
    "downpour": (0.05, ("window=4",), 400, ()),
    "dc-asgd": (0.1, (), 600, ()),
    "gap-aware": (0.2, (), 600, ()),
    "adaptive-braking": (0.02, (), 450, ()),  # at or above 0.90 from update 311
    "ormo": (0.02, (), 450, ()),  # from update 326
    "ormo-da": (0.02, (), 400, ()),  # from update 228
    "easgd": (0.05, ("window=4",), 500, ()),
    "eamsgd": (0.02, ("window=4",), 400, ()),
    "agn": (0.002, ("window=4",), 200, ()),  # from update 76
    "gem": (0.05, (), 400, ()),  # from update 275
    # Asynchronous DiLoCo lags (the reason Delayed Nesterov exists), so it is tested synchronous:
    # under BSP a round averages one pseudo-gradient per worker, which is DiLoCo exactly.
    # At or above 0.90 from round 40.
    "diloco": (0.7, ("window=4",), 60, ("--consistency", "bsp")),
    "diloco-dn": (0.7, ("window=4",), 200, ()),  # from update 152
}
CONSISTENCY = {
    # BSP averages one gradient per worker, so its rate is larger; at or above 0.90 from update 135.
    "bsp": ("asgd", 0.3, 200, ("--consistency", "bsp")),
    # Like plain ASGD above: at lr 0.1 over 600 updates one CI run ended at 0.839, and 8 runs of
    # `python -m benchmarks.cluster_spread --lr 0.1 --updates 600 --consistency ssp --ssp-bound 2`
    # gave 0.922-0.967; at lr 0.05 over 1000 updates 8 runs gave 0.947-0.972.
    "ssp": ("asgd", 0.05, 1000, ("--consistency", "ssp", "--ssp-bound", "2")),
}


def test_every_registered_rule_is_covered() -> None:
    assert set(CONFIGS) == set(RULES)


@pytest.mark.parametrize("rule", sorted(CONFIGS))
def test_rule_trains_digits(rule: str, tmp_path: Path) -> None:
    lr, options, updates, server_args = CONFIGS[rule]
    config = ClusterConfig(
        workers=4,
        slowdowns=(1.0, 1.0, 2.0, 4.0),
        rule=rule,
        lr=lr,
        rule_opts=options,
        until_clock=updates,
        log_dir=tmp_path,
        server_args=server_args,
    )
    report = run_cluster(config)
    assert report.clock >= updates
    assert report.test_accuracy > 0.85, f"{rule}: {report.test_accuracy:.3f}"
    assert all(w.pushes > 0 for w in report.workers)
    assert json.loads((tmp_path / "report.json").read_text())["clock"] == report.clock


@pytest.mark.parametrize("model", sorted(CONSISTENCY))
def test_consistency_model_trains_digits(model: str, tmp_path: Path) -> None:
    rule, lr, updates, server_args = CONSISTENCY[model]
    report = run_cluster(
        ClusterConfig(
            workers=4,
            slowdowns=(1.0, 1.0, 2.0, 4.0),
            rule=rule,
            lr=lr,
            until_clock=updates,
            log_dir=tmp_path,
            server_args=server_args,
        )
    )
    assert report.test_accuracy > 0.85, f"{model}: {report.test_accuracy:.3f}"
    if model == "bsp":
        # Every update waits for every live worker: nothing is ever stale.
        assert [w.max_staleness for w in report.workers] == [0, 0, 0, 0]
