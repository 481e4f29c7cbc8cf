"""The tinylm task: its text and split, its model's shapes and size, that it learns, its metric."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch

from pstasks.tasks import load_task
from pstasks.tinylm import TINYLM, Decoder, corpus, split_point, token_cross_entropy, windows
from psworker.task import LOSS, evaluate

CONTEXT = TINYLM.context


def test_the_text_is_the_pydoc_topics_in_key_order_and_deterministic() -> None:
    from pydoc_data.topics import topics

    text = corpus()
    assert text == corpus()
    first = sorted(topics)[0]
    assert text.startswith(topics[first].encode("utf-8"))
    assert len(text) > 100_000


def test_train_and_validation_windows_come_from_disjoint_parts_of_the_text() -> None:
    task = load_task("tinylm")
    data = torch.frombuffer(bytearray(corpus()), dtype=torch.uint8).to(torch.long)
    cut = split_point(data.shape[0])
    assert 0.85 * data.shape[0] < cut < 0.95 * data.shape[0]
    # Rebuilt from the two parts alone, the windows are the task's: nothing crosses the cut.
    train_inputs, _ = windows(data[:cut], CONTEXT, CONTEXT // 2)
    test_inputs, test_targets = windows(data[cut:], CONTEXT, CONTEXT + 1)
    assert torch.equal(task.train_inputs, train_inputs)
    assert torch.equal(task.test_inputs, test_inputs)
    # Targets are the inputs shifted by one byte; validation windows do not overlap.
    assert torch.equal(task.train_targets[:, :-1], task.train_inputs[:, 1:])
    starts = data[cut :: CONTEXT + 1][: test_inputs.shape[0]]
    assert torch.equal(test_inputs[:, 0], starts)
    assert torch.equal(test_targets, task.test_targets)
    again = load_task("tinylm")
    assert torch.equal(again.test_targets, task.test_targets)


def test_shapes_dtype_and_about_a_million_parameters() -> None:
    task = load_task("tinylm")
    assert task.train_inputs.dtype == torch.long and task.train_inputs.shape[1] == CONTEXT
    assert task.test_targets.shape == task.test_inputs.shape
    model = task.build_model()
    count = sum(p.numel() for p in model.parameters())
    assert 700_000 < count < 1_300_000
    assert not list(model.buffers())  # the server carries parameters only
    logits = model(task.train_inputs[:3])
    assert logits.shape == (3, CONTEXT, 256)
    with pytest.raises(ValueError, match="context"):
        model(torch.zeros(1, CONTEXT + 1, dtype=torch.long))


def test_the_model_is_causal() -> None:
    torch.manual_seed(0)
    model = Decoder(TINYLM).eval()
    tokens = torch.randint(0, 256, (1, CONTEXT))
    changed = tokens.clone()
    changed[0, -1] = (tokens[0, -1] + 1) % 256
    with torch.no_grad():
        # Changing the last byte changes no earlier position's prediction.
        assert torch.allclose(model(tokens)[0, :-1], model(changed)[0, :-1], atol=1e-5)


@pytest.fixture
def one_thread() -> Iterator[None]:
    # Two threads on a busy two-core machine spend more time waiting for each other than computing.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_loss_falls_within_a_few_dozen_adamw_steps_on_cpu(one_thread: None) -> None:
    task = load_task("tinylm")
    assert task.build_optimizer is not None
    model = task.build_model()
    optimizer = task.build_optimizer(model.parameters())
    assert isinstance(optimizer, torch.optim.AdamW)
    generator = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(30):
        index = torch.randint(0, task.train_size, (8,), generator=generator)
        optimizer.zero_grad()
        loss = task.loss(model(task.train_inputs[index]), task.train_targets[index])
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        losses.append(float(loss.detach()))
    # Uniform over 256 bytes is ln 256 ≈ 5.5; byte frequencies alone are worth about 3.
    assert losses[0] > 5.0
    assert sum(losses[-5:]) / 5 < 3.6


def test_the_metric_is_validation_loss_lower_is_better() -> None:
    task = load_task("tinylm")
    assert task.metric is LOSS and not task.metric.higher_is_better
    assert task.disjoint_shards
    small = task.shard(0, 4)
    assert small.train_size == task.train_size // 4
    # evaluate() counts one target per position; the loss is the mean token cross-entropy.
    tiny = replace(task, test_inputs=task.test_inputs[:8], test_targets=task.test_targets[:8])
    accuracy, loss = evaluate(task.build_model(), tiny, torch.device("cpu"))
    assert 0.0 <= accuracy < 0.05
    with torch.no_grad():
        logits = task.build_model()(task.test_inputs[:8])
    assert loss == pytest.approx(float(token_cross_entropy(logits, task.test_targets[:8])), rel=1e-4)
