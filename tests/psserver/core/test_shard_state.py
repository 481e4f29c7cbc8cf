"""The checkpoint form: what belongs to this shard, and the saved model checked against its layout."""

from __future__ import annotations

import pytest
import torch

from psproto.layout import Layout
from psserver.core.config import ShardConfig
from psserver.core.rules import RuleSpec
from psserver.core.shard_state import (
    STATE_FORMAT,
    StateError,
    capture,
    check_belongs,
    damage_as_state_error,
    parameter_state,
)

LAYOUT = Layout.from_named_shapes([("w", (2, 3))])
CONFIG = ShardConfig(RuleSpec.parse("asgd", {"lr": "0.1"}))


def saved(params: torch.Tensor | None = None, layout: Layout | None = LAYOUT) -> dict[str, object]:
    counters = {"initialized": True, "clock": 5, "applied_pushes": 5}
    membership = {"workers": [], "memories": {}, "id_counter": 1, "evictions": 0}
    values = params if params is not None else torch.arange(6, dtype=torch.float32)
    return capture(CONFIG, layout, (values, {}), counters, membership)


def test_capture_copies_the_tensors_and_names_the_shard() -> None:
    params = torch.zeros(6)
    state = saved(params)
    params.fill_(1.0)
    assert state["format"] == STATE_FORMAT and state["rule"] == "asgd" and state["clock"] == 5
    assert state["layout"] == [["w", [2, 3]]] and torch.equal(state["params"], torch.zeros(6))  # type: ignore[arg-type]


def test_a_state_of_another_rule_shard_or_format_does_not_belong() -> None:
    check_belongs(saved(), CONFIG)
    with pytest.raises(StateError, match="format"):
        check_belongs({**saved(), "format": 99}, CONFIG)
    with pytest.raises(StateError, match="shard 1 of 2"):
        check_belongs({**saved(), "shard_index": 1, "num_shards": 2}, CONFIG)


def test_the_saved_model_must_fit_its_layout() -> None:
    model = parameter_state(saved(), CONFIG)
    assert model is not None and model.layout.hash == LAYOUT.hash
    assert parameter_state(saved(layout=None), CONFIG) is None
    with pytest.raises(StateError, match="do not fit the layout"):
        parameter_state(saved(torch.zeros(5)), CONFIG)


def test_damage_is_reported_as_a_state_error() -> None:
    with pytest.raises(StateError, match="incomplete or damaged"), damage_as_state_error():
        check_belongs({"format": STATE_FORMAT}, CONFIG)  # no rule, shard or count
