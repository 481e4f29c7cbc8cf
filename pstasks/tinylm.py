"""Byte-level language models on pydoc text: ``tinylm`` (about 0.86M parameters) and
``gpt2-small`` (GPT-2 small's shape, 124,439,808 parameters), one decoder of two sizes.

The text is what every Python installation ships: the topics of ``pydoc_data.topics`` (the
help pages of the language reference), joined in sorted key order and UTF-8 encoded, so the
bytes are the same on every machine with the same Python. The last :data:`HELD_OUT` of the
bytes are the validation split; examples are windows of ``sequence_length`` bytes (inputs) and
the same window shifted by one (targets). Training windows start every ``sequence_length // 2``
bytes of the training part (each byte is in two of them), validation windows do not overlap,
and no window crosses the split. Windows are views of the text, never copies: a 1024-byte
window starting every 512 bytes costs nothing beyond the text.

Tokens are bytes (ids below 256) for both models, so nothing is downloaded and no tokenizer is
needed. ``gpt2-small`` keeps GPT-2's 50,257-entry vocabulary all the same, so that its
parameters are GPT-2 small's: the ids from 256 up never occur, and their logits learn to be
improbable.

The metric is the validation loss (mean next-byte cross-entropy, lower is better) with the
perplexity ``exp(loss)`` beside it; the inner optimizer of local-step procedures is AdamW.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional

from pstasks.task_error import TaskError
from psworker.task import LOSS, Task

BYTES = 256
HELD_OUT = 0.1
ADAMW_LR = 3e-3
ADAMW_WEIGHT_DECAY = 0.01
# GPT-2's initialisation of a tied embedding: logits start near zero, the loss near ln(vocabulary).
TIED_EMBEDDING_STD = 0.02


@dataclass(frozen=True)
class DecoderConfig:
    """The shape of a decoder-only transformer (the feed-forward width is four times ``width``)."""

    layers: int
    width: int
    heads: int
    # The longest input, in tokens: the learned position table has this many rows.
    context: int
    vocabulary: int = BYTES
    # The output layer is the input embedding's transpose, without a bias (GPT-2); otherwise its
    # own layer with a bias.
    tied: bool = False

    def __post_init__(self) -> None:
        sizes = {"layers": self.layers, "width": self.width, "heads": self.heads, "context": self.context}
        for name, value in sizes.items():
            if value < 1:
                raise ValueError(f"{name} must be at least 1, not {value}")
        if self.width % self.heads:
            raise ValueError(f"width {self.width} is not a multiple of heads {self.heads}")
        if self.vocabulary < BYTES:
            raise ValueError(f"vocabulary {self.vocabulary} cannot hold the {BYTES} byte values")


# 32 bytes of context: a step of batch 32 is 1,024 tokens, which keeps it CPU-fast (64 doubles
# the matrix work and quadruples the attention's).
TINYLM = DecoderConfig(layers=4, width=128, heads=4, context=32)
GPT2_SMALL = DecoderConfig(layers=12, width=768, heads=12, context=1024, vocabulary=50257, tied=True)


class Decoder(nn.Module):
    """Token embedding + learned positions, pre-norm causal transformer layers, a final norm and
    a classifier over the vocabulary.

    No dropout (the simulator's runs must be deterministic) and no buffers (the server carries
    parameters only): the causal mask is built per call from the input's length.
    """

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocabulary, config.width)
        self.position = nn.Parameter(torch.zeros(config.context, config.width))
        nn.init.normal_(self.position, std=0.02)
        layer = nn.TransformerEncoderLayer(
            config.width,
            config.heads,
            4 * config.width,
            dropout=0.0,
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        # enable_nested_tensor only matters for padding masks, which a causal LM does not use.
        self.layers = nn.TransformerEncoder(layer, config.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(config.width)
        self.head = None if config.tied else nn.Linear(config.width, config.vocabulary)
        if config.tied:
            nn.init.normal_(self.embed.weight, std=TIED_EMBEDDING_STD)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        if length > self.config.context:
            raise ValueError(f"{length} tokens: the model's context is {self.config.context}")
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        hidden = self.embed(tokens) + self.position[:length]
        hidden = self.norm(self.layers(hidden, mask=mask, is_causal=True))
        if self.head is None:
            return functional.linear(hidden, self.embed.weight)
        return self.head(hidden)  # type: ignore[no-any-return]


def corpus() -> bytes:
    """The pydoc topics, in sorted key order, as UTF-8 bytes (deterministic for a Python version)."""
    from pydoc_data.topics import topics

    return "".join(topics[key] for key in sorted(topics)).encode("utf-8")


def split_point(size: int) -> int:
    """The first byte of the validation split."""
    return size - int(size * HELD_OUT)


def windows(data: torch.Tensor, length: int, stride: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of every window of ``length + 1`` bytes starting at multiples of ``stride``,
    as views of ``data``."""
    chunks = data.unfold(0, length + 1, stride)
    return chunks[:, :-1], chunks[:, 1:]


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every position of every window (logits B×T×V, targets B×T)."""
    return functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def adamw(parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """The inner optimizer of local-step procedures (DiLoCo's AdamW)."""
    return torch.optim.AdamW(parameters, lr=ADAMW_LR, weight_decay=ADAMW_WEIGHT_DECAY)


def language_model(name: str, config: DecoderConfig, batch_size: int, seed: int, sequence_length: int | None) -> Task:
    """The pydoc text in windows of ``sequence_length`` bytes (default: the model's context) for a
    decoder of ``config``; a TaskError when the windows would not fit the model."""
    length = config.context if sequence_length is None else sequence_length
    if not 1 <= length <= config.context:
        raise TaskError(f"sequence_length {length}: {name} takes windows of 1 to {config.context} bytes")
    data = torch.frombuffer(bytearray(corpus()), dtype=torch.uint8).to(torch.long)
    cut = split_point(data.shape[0])
    train_inputs, train_targets = windows(data[:cut], length, max(1, length // 2))
    test_inputs, test_targets = windows(data[cut:], length, length + 1)

    def build() -> nn.Module:
        torch.manual_seed(seed)
        return Decoder(config)

    return Task(
        name,
        build,
        train_inputs,
        train_targets,
        test_inputs,
        test_targets,
        loss=token_cross_entropy,
        batch_size=batch_size,
        disjoint_shards=True,
        build_optimizer=adamw,
        metric=LOSS,
    )


def tinylm(seed: int = 0, data_dir: Path | None = None, sequence_length: int | None = None) -> Task:
    """The small model, 32 windows of 32 bytes a step; ``data_dir`` is ignored (the text ships with Python)."""
    return language_model("tinylm", TINYLM, 32, seed, sequence_length)


def gpt2_small(seed: int = 0, data_dir: Path | None = None, sequence_length: int | None = None) -> Task:
    """GPT-2 small's shape, 8 windows of 1,024 bytes a step (8,192 tokens: a GPU's step; on a CPU,
    shorten the windows with ``sequence_length`` and the batch with the run's task options)."""
    return language_model("gpt2-small", GPT2_SMALL, 8, seed, sequence_length)
