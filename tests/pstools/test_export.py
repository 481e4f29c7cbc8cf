"""Export from checkpoints: an intact one becomes the model's state dict, a damaged one is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from psproto import codec
from psproto.layout import Layout
from psserver.core.checkpoint import write_checkpoint
from psserver.core.rules import RuleSpec
from psserver.core.shard import Shard, ShardConfig
from pstools.cli import main
from pstools.export import ExportError, state_dict_from_checkpoints

LAYOUT = Layout.from_named_shapes([("w", (2, 3)), ("b", (2,))])


def _state(values: torch.Tensor) -> dict[str, object]:
    shard = Shard(ShardConfig(RuleSpec.parse("asgd", {"lr": "0.1"})))
    worker = shard.join("a", "cpu", False, LAYOUT, LAYOUT.hash).worker.worker_id
    assembler = shard.begin_upload(worker, LAYOUT.hash)
    for chunk in codec.encode(values):
        shard.decode_chunk(assembler, chunk)
    shard.finish_upload(assembler)
    return shard.state_dict()


def _alter_middle(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle - 20 : middle + 20] = bytes(b ^ 0xFF for b in data[middle - 20 : middle + 20])
    path.write_bytes(bytes(data))


def test_an_intact_checkpoint_exports_every_tensor(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, _state(torch.arange(8, dtype=torch.float32)), keep=3)
    tensors = state_dict_from_checkpoints([tmp_path])
    assert torch.equal(tensors["w"], torch.arange(6, dtype=torch.float32).reshape(2, 3))
    assert torch.equal(tensors["b"], torch.tensor([6.0, 7.0]))


def test_a_previous_format_checkpoint_still_exports(tmp_path: Path) -> None:
    torch.save(_state(torch.ones(8)), tmp_path / "ckpt-00000001-clock-0.pt")
    assert torch.equal(state_dict_from_checkpoints([tmp_path])["b"], torch.ones(2))


def test_a_damaged_file_is_refused_with_its_name_and_problem(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path, _state(torch.ones(8)), keep=3).path
    _alter_middle(path)
    with pytest.raises(ExportError) as caught:
        state_dict_from_checkpoints([path])
    message = str(caught.value)
    assert message.startswith(f"{path} is damaged (checksum mismatch") and "\n" not in message


def test_a_folder_whose_newest_is_damaged_names_the_intact_one_before_it(tmp_path: Path) -> None:
    good = write_checkpoint(tmp_path, _state(torch.ones(8)), keep=3).path
    newest = write_checkpoint(tmp_path, _state(torch.zeros(8)), keep=3).path
    newest.write_bytes(newest.read_bytes()[:300])
    with pytest.raises(ExportError, match="truncated") as caught:
        state_dict_from_checkpoints([tmp_path])
    assert str(newest) in str(caught.value) and f"the newest intact one before it is {good}" in str(caught.value)


def test_the_command_exits_2_with_a_one_line_error(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path, _state(torch.ones(8)), keep=3).path
    _alter_middle(path)
    out = tmp_path / "model.safetensors"
    result = CliRunner().invoke(main, ["export", "--checkpoint", str(path), "--out", str(out)])
    assert result.exit_code == 2
    error = next(line for line in result.output.splitlines() if "damaged" in line)
    assert str(path.name) in error and "checksum mismatch" in error
    assert not out.exists()
