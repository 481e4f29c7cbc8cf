"""ResNet-18 as a trainable module, without torchvision: the same tensors, names and order.

``benchmarks.harness.models.resnet18_shapes`` lists its 11,689,512 parameters; this is the
network those shapes belong to (He et al. 2016, torchvision's layout: 7×7 stem, four stages
of two basic blocks, a 1×1 projection where a stage changes width), so a worker step can
run a real forward and backward pass on any device.
"""

from __future__ import annotations

import torch
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, in_channels: int, channels: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.downsample: nn.Module | None = None
        if stride != 1 or in_channels != channels:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_channels, channels, 1, stride=stride, bias=False), nn.BatchNorm2d(channels)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        activated: torch.Tensor = self.relu(out + identity)
        return activated


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        in_channels = 64
        for index, channels in enumerate((64, 128, 256, 512), start=1):
            stride = 1 if index == 1 else 2
            stage = nn.Sequential(BasicBlock(in_channels, channels, stride), BasicBlock(channels, channels, 1))
            self.add_module(f"layer{index}", stage)
            in_channels = channels
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for index in range(1, 5):
            x = getattr(self, f"layer{index}")(x)
        logits: torch.Tensor = self.fc(torch.flatten(self.avgpool(x), 1))
        return logits
