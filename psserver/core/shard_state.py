"""The checkpoint form of a shard: the plain dictionary ``Shard.state_dict`` returns, and its checks.

Plain values and tensors only, so ``torch.load(weights_only=True)`` reads it back. Reading
checks the format and that the state is this shard's (rule, shard index and count) and that
its tensors fit its layout before the shard changes anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from psproto.layout import Layout, LayoutError
from psserver.core.config import ShardConfig

# Version of the dictionary ``Shard.state_dict`` returns (and checkpoints hold).
STATE_FORMAT = 1


class StateError(ValueError):
    """A saved state that does not fit this shard (another rule, shard or format)."""


@dataclass(frozen=True)
class ParameterState:
    """The part of the state that is the model: its layout, the parameters, the rule's state."""

    layout: Layout
    params: torch.Tensor
    rule_state: Mapping[str, torch.Tensor]


@contextmanager
def damage_as_state_error() -> Iterator[None]:
    """Turn what reading an incomplete or damaged state raises into a ``StateError``."""
    try:
        yield
    except StateError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError, LayoutError) as error:
        raise StateError(f"the saved state is incomplete or damaged: {error!r}") from None


# Makes the state's copy of one tensor (its key: "params" or "rule_state/NAME"); the default clones it.
Copier = Callable[[str, torch.Tensor], torch.Tensor]


def clone(_key: str, tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().clone()


def capture(
    config: ShardConfig,
    layout: Layout | None,
    tensors: tuple[torch.Tensor, Mapping[str, torch.Tensor]],
    counters: Mapping[str, Any],
    membership: Mapping[str, Any],
    copy: Copier = clone,
) -> dict[str, Any]:
    """The state to save: the parameters and the rule's state (``tensors``, copied by ``copy``);
    ``counters`` (initialized, clock, applied_pushes) and ``membership`` are merged in."""
    params, rule_state = tensors
    return {
        "format": STATE_FORMAT,
        "shard_index": config.shard_index,
        "num_shards": config.num_shards,
        "rule": config.rule.rule.name,
        "rule_options": dict(config.rule.options.as_strings()),
        "layout": [[name, list(shape)] for name, shape in layout.specs] if layout else None,
        **counters,
        "params": copy("params", params),
        "rule_state": {k: copy(f"rule_state/{k}", v) for k, v in rule_state.items()},
        **membership,
        "written_at": time.time(),
    }


def check_belongs(state: Mapping[str, Any], config: ShardConfig) -> None:
    """Raise ``StateError`` unless ``state`` is of this format, rule, shard index and count."""
    if state.get("format") != STATE_FORMAT:
        raise StateError(f"saved state format {state.get('format')!r}; this server reads format {STATE_FORMAT}")
    ours = (config.rule.rule.name, config.shard_index, config.num_shards)
    theirs = (state["rule"], state["shard_index"], state["num_shards"])
    if ours != theirs:
        raise StateError(
            f"the saved state is of rule {theirs[0]}, shard {theirs[1]} of {theirs[2]}; this server runs rule "
            f"{ours[0]}, shard {ours[1]} of {ours[2]}. Start it with the same --rule, --shard-index and "
            "--num-shards, or use another --checkpoint-dir"
        )


def parameter_state(state: Mapping[str, Any], config: ShardConfig) -> ParameterState | None:
    """The saved model, checked against its layout; None when the state was saved before any Join."""
    if state["layout"] is None:
        return None
    layout = Layout.from_named_shapes(
        ((str(name), tuple(int(d) for d in shape)) for name, shape in state["layout"]), config.num_shards
    )
    params: torch.Tensor = state["params"]
    expected = layout.shard(config.shard_index).length
    if params.shape != (expected,) or params.dtype != torch.float32:
        raise StateError(f"saved parameters {tuple(params.shape)} do not fit the layout ({expected},)")
    return ParameterState(layout, params, state["rule_state"])
