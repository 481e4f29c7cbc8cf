"""The trained model as a PyTorch state dict: from shard checkpoints, or pulled from running shards.

The result maps each tensor name of the model's layout (``named_parameters`` names) to a tensor
of its shape, so ``model.load_state_dict(load_file(path), strict=False)`` restores the trained
parameters into the user's module (buffers such as BatchNorm statistics are not on the server;
``strict=False`` leaves them as they are).

A checkpoint's checksum is verified before it is used: a damaged one (checksum mismatch,
truncated, unreadable) is refused with the file and the problem, never exported, and for a
folder whose newest checkpoint is damaged the error names the newest intact one to give
instead. Checkpoints of the previous format (no checksum) are exported unverified.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from psproto.layout import Layout
from psserver.core.checkpoint import CheckpointError, DamagedCheckpointError, list_checkpoints, read_checkpoint
from psserver.core.checkpoint_file import verify


class ExportError(ValueError):
    """Inputs that do not make one whole model; the message says what is missing or mismatched."""


def _checkpoint_file(path: Path) -> tuple[Path, bool]:
    """The file to read for ``path`` (a folder: its newest checkpoint), and whether it came from a folder."""
    if path.is_dir():
        found = list_checkpoints(path)
        if not found:
            raise ExportError(f"{path} holds no checkpoint (ckpt-*.pt)")
        return found[-1][2], True
    return path, False


def _older_intact(newest: Path) -> str:
    """A hint naming the newest intact checkpoint in the folder whose newest, ``newest``, is damaged."""
    for _, _, older in reversed(list_checkpoints(newest.parent)[:-1]):
        if verify(older).status != "damaged":
            return f"; the newest intact one before it is {older}: give that file with --checkpoint"
    return ""


def state_dict_from_checkpoints(paths: Sequence[Path]) -> dict[str, torch.Tensor]:
    """Merge one checkpoint per shard (files, or folders whose newest checkpoint is used)."""
    shards: dict[int, tuple[Path, dict[str, Any]]] = {}
    layout: Layout | None = None
    for given in paths:
        path, from_folder = _checkpoint_file(given)
        try:
            state = read_checkpoint(path)
        except DamagedCheckpointError as error:
            hint = _older_intact(path) if from_folder else ""
            raise ExportError(f"{path} is damaged ({error.problem}), refusing to export it{hint}") from None
        except (CheckpointError, OSError, RuntimeError, ValueError) as error:
            raise ExportError(f"cannot read {path}: {error}") from None
        if state.get("layout") is None or not state.get("initialized"):
            raise ExportError(f"{path} holds no parameters yet (no worker had initialised the shard)")
        this = Layout.from_named_shapes(
            ((str(name), tuple(int(d) for d in shape)) for name, shape in state["layout"]), int(state["num_shards"])
        )
        if layout is not None and this.hash != layout.hash:
            raise ExportError(f"{path} belongs to another model or shard count than {paths[0]}")
        layout = this
        index = int(state["shard_index"])
        if index in shards:
            raise ExportError(f"{path} and {shards[index][0]} are both shard {index}; give one checkpoint per shard")
        shards[index] = (path, state)
    assert layout is not None
    missing = sorted(set(range(layout.num_shards)) - set(shards))
    if missing:
        raise ExportError(f"the model has {layout.num_shards} shards; no checkpoint for shard(s) {missing}")
    flat = torch.empty(layout.total_length)
    for index, (path, state) in shards.items():
        shard = layout.shard(index)
        params = state["params"]
        if not isinstance(params, torch.Tensor) or params.shape != (shard.length,):
            raise ExportError(f"{path}: its parameters do not fit shard {index} of the layout")
        flat[shard.offset : shard.end] = params
    return named_tensors(layout, flat)


def named_tensors(layout: Layout, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each tensor of the layout as its own (contiguous, unshared) tensor."""
    return {slot.name: flat[slot.offset : slot.end].reshape(slot.shape).clone() for slot in layout.slots}


def save_state_dict(tensors: Mapping[str, torch.Tensor], out: Path) -> str:
    """Write ``.safetensors`` (by suffix) or a ``torch.save`` state dict; returns the format used."""
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file(dict(tensors), str(out))
        return "safetensors"
    torch.save(dict(tensors), out)
    return "pytorch"
