"""The gpt2-small task: GPT-2 small's shape and parameter count, balanced shards, and the task
options (batch size, window length) a CPU run shrinks it with."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from psproto.layout import Layout
from pstasks.cli import main
from pstasks.task_error import TaskError
from pstasks.tasks import TaskOptions, load_task
from pstasks.tinylm import TINYLM, Decoder
from psworker.task import evaluate

# GPT-2 small (Radford et al., 2019): wte 50,257×768 (tied to the output layer), wpe 1,024×768,
# 12 layers of 7,087,872 parameters, a final norm of 1,536.
GPT2_SMALL_PARAMETERS = 50_257 * 768 + 1_024 * 768 + 12 * 7_087_872 + 2 * 768


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    """One gpt2-small model for the module's tests (1 s and 0.5 GB to build on a CPU)."""
    return load_task("gpt2-small").build_model()


def _shapes(model: torch.nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    return [(name, tuple(p.shape)) for name, p in model.named_parameters()]


def test_the_model_has_gpt2_smalls_shape_and_parameter_count(model: torch.nn.Module) -> None:
    shapes = dict(_shapes(model))
    assert sum(math.prod(shape) for shape in shapes.values()) == GPT2_SMALL_PARAMETERS == 124_439_808
    assert shapes["embed.weight"] == (50_257, 768) and shapes["position"] == (1_024, 768)
    # Tied: the output layer is the embedding, so no head of its own.
    assert not any(name.startswith("head") for name in shapes)
    assert shapes["layers.layers.11.self_attn.in_proj_weight"] == (3 * 768, 768)
    assert shapes["layers.layers.11.linear1.weight"] == (4 * 768, 768)
    assert "layers.layers.12.linear1.weight" not in shapes
    # tinylm is the same decoder, smaller and untied (its own classifier, with a bias).
    tiny = dict(_shapes(Decoder(TINYLM)))
    assert tiny["head.weight"] == (256, 128) and sum(math.prod(s) for s in tiny.values()) == 863_232


@pytest.mark.parametrize("num_shards", [4, 5, 6, 7, 8])
def test_its_shards_are_balanced_within_one_percent(model: torch.nn.Module, num_shards: int) -> None:
    # The embedding alone is 31% of the model: whole tensors could not balance 4 shards or more.
    layout = Layout.from_named_shapes(_shapes(model), num_shards)
    lengths = [shard.length for shard in layout.shards]
    assert max(lengths) / min(lengths) <= 1.01


def test_a_short_cpu_step_runs_and_starts_near_uniform_over_the_vocabulary(model: torch.nn.Module) -> None:
    task = load_task("gpt2-small", options=TaskOptions(batch_size=1, sequence_length=8))
    assert task.name == "gpt2-small" and task.batch_size == 1
    assert task.train_inputs.shape[1] == 8 and task.test_targets.shape[1] == 8
    assert int(task.train_inputs.max()) < 256  # bytes, whatever the vocabulary
    logits = model(task.train_inputs[:1])
    assert logits.shape == (1, 8, 50_257)
    loss = task.loss(logits, task.train_targets[:1])
    # The tied embedding starts small (std 0.02), so the logits start near zero: ln 50,257 ≈ 10.8.
    assert abs(float(loss.detach()) - math.log(50_257)) < 0.5
    loss.backward()  # type: ignore[no-untyped-call]
    embedding = model.get_parameter("embed.weight")
    assert embedding.grad is not None
    # Rows of bytes not in the input still learn through the output layer.
    assert float(embedding.grad[300].abs().sum()) > 0


def test_its_default_windows_are_the_context_of_a_gpu_step() -> None:
    task = load_task("gpt2-small")
    assert task.batch_size == 8 and task.train_inputs.shape[1] == 1_024
    # Views of the text: a 1,024-byte window every 512 bytes holds no copy of it.
    assert task.train_inputs.untyped_storage().data_ptr() == task.test_inputs.untyped_storage().data_ptr()


@pytest.mark.parametrize(
    ("spec", "options", "message"),
    [
        ("gpt2-small", TaskOptions(sequence_length=1_025), "gpt2-small takes windows of 1 to 1024 bytes"),
        ("tinylm", TaskOptions(sequence_length=33), "tinylm takes windows of 1 to 32 bytes"),
        ("digits", TaskOptions(sequence_length=8), "language-model tasks .tinylm, gpt2-small., not of digits"),
    ],
)
def test_a_window_length_a_task_cannot_take_is_refused(spec: str, options: TaskOptions, message: str) -> None:
    with pytest.raises(TaskError, match=message):
        load_task(spec, options=options)


def test_a_batch_size_applies_to_any_task_and_must_be_positive() -> None:
    assert load_task("digits", options=TaskOptions(batch_size=5)).batch_size == 5
    assert load_task("tinylm", options=TaskOptions(sequence_length=16)).train_inputs.shape[1] == 16
    with pytest.raises(ValueError, match="batch_size must be at least 1, not 0"):
        TaskOptions(batch_size=0)


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ("batch_size = 0", "task_options: batch_size must be at least 1, not 0"),
        ("sequence_length = 2048", "sequence_length 2048: gpt2-small takes windows of 1 to 1024 bytes"),
        ("sequence = 8", "unknown key task_options.sequence"),
    ],
)
def test_psworker_train_refuses_bad_task_options_with_exit_2(tmp_path: Path, table: str, message: str) -> None:
    config = tmp_path / "worker.toml"
    config.write_text(f'task = "gpt2-small"\n[task_options]\n{table}\n')
    result = CliRunner().invoke(main, ["train", "--server", "127.0.0.1:9", "--config", str(config)])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_evaluation_feeds_a_language_model_a_bounded_number_of_targets_at_once() -> None:
    # 1,024-byte windows: 16 a call (16,384 targets), so gpt2-small's logits stay at 3.3 GB.
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(256, 4), torch.nn.Linear(4, 256))
    seen: list[int] = []
    model.register_forward_hook(lambda module, args, output: seen.append(args[0].shape[0]))
    tokens = torch.randint(0, 256, (40, 1_025))
    task = replace(load_task("tinylm"), test_inputs=tokens[:, :-1], test_targets=tokens[:, 1:])
    accuracy, loss = evaluate(model, task, torch.device("cpu"))
    assert seen == [16, 16, 8]
    with torch.no_grad():
        whole = task.loss(model(task.test_inputs), task.test_targets)
    assert loss == pytest.approx(float(whole), rel=1e-5) and 0 <= accuracy <= 1
