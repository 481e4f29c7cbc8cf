"""The model component: adopting a layout, Init, applying an update (after freezing the pulls)."""

from __future__ import annotations

import pytest
import torch

from psproto.layout import Layout
from psserver.core.config import ShardConfig
from psserver.core.errors import ErrorKind, ShardError
from psserver.core.model import Model
from psserver.core.observer import NullObserver
from psserver.core.refusals import Refusals
from psserver.core.rules import PayloadKind, RuleSpec
from psserver.core.snapshots import SnapshotStore

LAYOUT = Layout.from_named_shapes([("w", (2, 2))])


def model(frozen: list[torch.Tensor] | None = None, **config: int) -> Model:
    shard_config = ShardConfig(RuleSpec.parse("asgd", {"lr": "0.5"}), **config)  # type: ignore[arg-type]
    calls = frozen if frozen is not None else []
    return Model(shard_config, Refusals(NullObserver()), SnapshotStore(1 << 20), calls.append)


def test_adopting_a_layout_makes_zero_parameters_and_a_rule() -> None:
    adopted = model()
    adopted.adopt(LAYOUT)
    assert adopted.layout is LAYOUT and torch.equal(adopted.params, torch.zeros(4)) and adopted.rule is not None


def test_a_layout_over_the_parameter_limit_is_refused() -> None:
    with pytest.raises(ShardError) as refused:
        model(max_parameters=3).adopt(LAYOUT)
    assert refused.value.kind is ErrorKind.LIMIT_REACHED


def test_init_installs_the_values_once() -> None:
    adopted = model()
    adopted.adopt(LAYOUT)
    assert adopted.install(torch.ones(4)) and not adopted.install(torch.full((4,), 2.0))
    assert adopted.initialized and torch.equal(adopted.params, torch.ones(4))


def test_apply_freezes_the_pulls_then_updates_and_advances_the_clock() -> None:
    frozen: list[torch.Tensor] = []
    adopted = model(frozen)
    adopted.adopt(LAYOUT)
    adopted.install(torch.ones(4))
    adopted.clock = 3
    outcome, seconds = adopted.apply(1, torch.ones(4), PayloadKind.GRADIENT, base_clock=1, metadata={})
    assert frozen == [adopted.params] and seconds >= 0.0
    assert (outcome.clock, outcome.staleness, outcome.telemetry["staleness"]) == (4, 2, 2.0)
    assert adopted.applied_pushes == 1 and torch.equal(adopted.params, torch.full((4,), 0.5))
