"""The benchmarks' models: tensor shapes of known sizes, built without torchvision, by name."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

Shapes = list[tuple[str, tuple[int, ...]]]


def resnet18_shapes() -> list[tuple[str, tuple[int, ...]]]:
    """ResNet-18's trainable tensors (11,689,512 parameters), in torchvision's order and names."""
    shapes: list[tuple[str, tuple[int, ...]]] = [
        ("conv1.weight", (64, 3, 7, 7)),
        ("bn1.weight", (64,)),
        ("bn1.bias", (64,)),
    ]
    in_channels = 64
    for layer, channels in enumerate((64, 128, 256, 512), start=1):
        for block in range(2):
            prefix = f"layer{layer}.{block}"
            stride_block = block == 0 and channels != in_channels
            shapes += [
                (f"{prefix}.conv1.weight", (channels, in_channels if block == 0 else channels, 3, 3)),
                (f"{prefix}.bn1.weight", (channels,)),
                (f"{prefix}.bn1.bias", (channels,)),
                (f"{prefix}.conv2.weight", (channels, channels, 3, 3)),
                (f"{prefix}.bn2.weight", (channels,)),
                (f"{prefix}.bn2.bias", (channels,)),
            ]
            if stride_block:
                shapes += [
                    (f"{prefix}.downsample.0.weight", (channels, in_channels, 1, 1)),
                    (f"{prefix}.downsample.1.weight", (channels,)),
                    (f"{prefix}.downsample.1.bias", (channels,)),
                ]
        in_channels = channels
    shapes += [("fc.weight", (1000, 512)), ("fc.bias", (1000,))]
    return shapes


class ShapedModel(nn.Module):
    """A module whose only content is parameters of the given shapes (for data-path benchmarks)."""

    def __init__(self, shapes: list[tuple[str, tuple[int, ...]]]) -> None:
        super().__init__()
        self.names = [name for name, _ in shapes]
        for name, shape in shapes:
            self.register_parameter(name.replace(".", "_"), nn.Parameter(torch.randn(shape) * 0.01))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - never called
        raise NotImplementedError("a parameter container for benchmarks")


def small_shapes() -> list[tuple[str, tuple[int, ...]]]:
    """About 100k parameters: a two-layer MLP 784-128-10."""
    return [("fc1.weight", (128, 784)), ("fc1.bias", (128,)), ("fc2.weight", (10, 128)), ("fc2.bias", (10,))]


def tiny_shapes() -> Shapes:
    """A few thousand parameters in four tensors (smoke tests only)."""
    return [("fc1.weight", (32, 64)), ("fc1.bias", (32,)), ("fc2.weight", (10, 32)), ("fc2.bias", (10,))]


def gpt2_small_shapes() -> Shapes:
    """GPT-2 small's trainable tensors (124,439,808 parameters: 496 MB in fp32), in its usual names."""
    width, vocab, context, layers = 768, 50257, 1024, 12
    shapes: Shapes = [("wte.weight", (vocab, width)), ("wpe.weight", (context, width))]
    for layer in range(layers):
        prefix = f"h.{layer}"
        shapes += [
            (f"{prefix}.ln_1.weight", (width,)),
            (f"{prefix}.ln_1.bias", (width,)),
            (f"{prefix}.attn.c_attn.weight", (width, 3 * width)),
            (f"{prefix}.attn.c_attn.bias", (3 * width,)),
            (f"{prefix}.attn.c_proj.weight", (width, width)),
            (f"{prefix}.attn.c_proj.bias", (width,)),
            (f"{prefix}.ln_2.weight", (width,)),
            (f"{prefix}.ln_2.bias", (width,)),
            (f"{prefix}.mlp.c_fc.weight", (width, 4 * width)),
            (f"{prefix}.mlp.c_fc.bias", (4 * width,)),
            (f"{prefix}.mlp.c_proj.weight", (4 * width, width)),
            (f"{prefix}.mlp.c_proj.bias", (width,)),
        ]
    return [*shapes, ("ln_f.weight", (width,)), ("ln_f.bias", (width,))]


MODELS: dict[str, Callable[[], Shapes]] = {
    "resnet18": resnet18_shapes,
    "small": small_shapes,
    "tiny": tiny_shapes,
    "gpt2-small": gpt2_small_shapes,
}
# The model the targets are stated for, when a run includes it.
REFERENCE_MODEL = "resnet18"
