"""ResNet-18 for 1×28×28 images (about 11M parameters), for the ``fashion-resnet18`` task.

It follows torchvision's ``resnet18`` layout (``BasicBlock``, layers [2, 2, 2, 2] of 64, 128,
256 and 512 channels, the same parameter names and shapes in the blocks), written here because
torchvision has no CPU build on these machines. Adapted to small grey images as is usual for
CIFAR/MNIST-sized inputs: one input channel, a 3×3 stride-1 first convolution and no max-pool,
so a 28×28 image reaches the last stage as 4×4.

Batch normalisation keeps no running statistics (``track_running_stats=False``): they would be
buffers, which a parameter server does not carry, so every worker and the evaluator normalise
with the statistics of the batch in front of them. The affine weights are ordinary parameters.
"""

from __future__ import annotations

import torch
from torch import nn


def _norm(channels: int) -> nn.BatchNorm2d:
    return nn.BatchNorm2d(channels, track_running_stats=False)


class BasicBlock(nn.Module):
    """Two 3×3 convolutions with a residual connection (a 1×1 projection when the shape changes)."""

    def __init__(self, in_channels: int, channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = _norm(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = _norm(channels)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False), _norm(channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)  # type: ignore[no-any-return]


class ResNet18(nn.Module):
    """ResNet-18 (torchvision's layout) for ``in_channels``×28×28 inputs and ``num_classes`` classes."""

    def __init__(self, in_channels: int = 1, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False)
        self.bn1 = _norm(64)
        self.relu = nn.ReLU(inplace=True)
        stages = []
        in_planes = 64
        for index, planes in enumerate((64, 128, 256, 512)):
            stride = 1 if index == 0 else 2
            stages.append(nn.Sequential(BasicBlock(in_planes, planes, stride), BasicBlock(planes, planes, 1)))
            in_planes = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))  # type: ignore[no-any-return]
