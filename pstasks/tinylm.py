"""The ``tinylm`` task: a byte-level decoder-only transformer (about 0.86M parameters) on pydoc text.

The text is what every Python installation ships: the topics of ``pydoc_data.topics`` (the
help pages of the language reference), joined in sorted key order and UTF-8 encoded, so the
bytes are the same on every machine with the same Python. The last :data:`HELD_OUT` of the
bytes are the validation split; examples are windows of :data:`CONTEXT` bytes (inputs) and the
same window shifted by one (targets). Training windows start at every :data:`TRAIN_STRIDE`-th
byte of the training part, validation windows do not overlap, and no window crosses the split.

The metric is the validation loss (mean next-byte cross-entropy, lower is better) with the
perplexity ``exp(loss)`` beside it; the inner optimizer of local-step procedures is AdamW.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional

from psworker.task import LOSS, Task

# 32 bytes of context: a step of batch 32 is 1,024 tokens, which keeps it CPU-fast (64 doubles
# the matrix work and quadruples the attention's).
CONTEXT = 32
VOCAB = 256
HELD_OUT = 0.1
# A training window starts every this many bytes: ~26k windows, each byte in two of them,
# without keeping all ~420k possible starts in memory.
TRAIN_STRIDE = 16
D_MODEL = 128
LAYERS = 4
HEADS = 4
FEEDFORWARD = 4 * D_MODEL
ADAMW_LR = 3e-3
ADAMW_WEIGHT_DECAY = 0.01


def corpus() -> bytes:
    """The pydoc topics, in sorted key order, as UTF-8 bytes (deterministic for a Python version)."""
    from pydoc_data.topics import topics

    return "".join(topics[key] for key in sorted(topics)).encode("utf-8")


def split_point(size: int) -> int:
    """The first byte of the validation split."""
    return size - int(size * HELD_OUT)


def windows(data: torch.Tensor, stride: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of every window of ``CONTEXT + 1`` bytes starting at multiples of ``stride``."""
    chunks = data.unfold(0, CONTEXT + 1, stride)
    return chunks[:, :-1].contiguous(), chunks[:, 1:].contiguous()


class TinyDecoder(nn.Module):
    """Byte embedding + learned positions, pre-norm causal transformer layers, a byte classifier.

    No dropout (the simulator's runs must be deterministic) and no buffers (the server carries
    parameters only): the causal mask is built per call from the input's length.
    """

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D_MODEL)
        self.position = nn.Parameter(torch.zeros(CONTEXT, D_MODEL))
        nn.init.normal_(self.position, std=0.02)
        layer = nn.TransformerEncoderLayer(
            D_MODEL, HEADS, FEEDFORWARD, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        # enable_nested_tensor only matters for padding masks, which a causal LM does not use.
        self.layers = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        if length > CONTEXT:
            raise ValueError(f"{length} tokens: the model's context is {CONTEXT}")
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        hidden = self.embed(tokens) + self.position[:length]
        hidden = self.layers(hidden, mask=mask, is_causal=True)
        return self.head(self.norm(hidden))  # type: ignore[no-any-return]


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every position of every window (logits B×T×V, targets B×T)."""
    return functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def adamw(parameters: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
    """The inner optimizer of local-step procedures (DiLoCo's AdamW)."""
    return torch.optim.AdamW(parameters, lr=ADAMW_LR, weight_decay=ADAMW_WEIGHT_DECAY)


def tinylm(seed: int = 0, data_dir: Path | None = None) -> Task:
    """The pydoc byte-level language model; ``data_dir`` is ignored (the text ships with Python)."""
    data = torch.frombuffer(bytearray(corpus()), dtype=torch.uint8).to(torch.long)
    cut = split_point(data.shape[0])
    train_inputs, train_targets = windows(data[:cut], TRAIN_STRIDE)
    test_inputs, test_targets = windows(data[cut:], CONTEXT + 1)

    def build() -> nn.Module:
        torch.manual_seed(seed)
        return TinyDecoder()

    return Task(
        "tinylm",
        build,
        train_inputs,
        train_targets,
        test_inputs,
        test_targets,
        loss=token_cross_entropy,
        batch_size=32,
        disjoint_shards=True,
        build_optimizer=adamw,
        metric=LOSS,
    )
