"""ResNet-18 for 3×224×224 images, as a trainable module without torchvision: its tensors, names and order.

``benchmarks.harness.models.resnet18_shapes`` lists its 11,689,512 parameters; this is the
network those shapes belong to (He et al. 2016, torchvision's layout): the ImageNet stem (7×7
stride-2 convolution and a max-pool) in front of the basic blocks of
``psworker.models.resnet``, which the ``fashion-resnet18`` task uses with a small-image stem.
Like that task's model it keeps no batch-norm running statistics (a parameter server carries
parameters, not buffers), so a worker step runs a real forward and backward pass on any device.
"""

from __future__ import annotations

import torch
from torch import nn

from psworker.models.resnet import BasicBlock


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64, track_running_stats=False)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages = []
        in_channels = 64
        for index, channels in enumerate((64, 128, 256, 512)):
            stride = 1 if index == 0 else 2
            stages.append(nn.Sequential(BasicBlock(in_channels, channels, stride), BasicBlock(channels, channels, 1)))
            in_channels = channels
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        logits: torch.Tensor = self.fc(torch.flatten(self.avgpool(x), 1))
        return logits
