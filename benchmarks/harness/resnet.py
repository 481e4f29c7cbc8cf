"""ResNet-18 for 3×224×224 images, as a trainable module without torchvision: its tensors, names and order.

``benchmarks.harness.models.resnet18_shapes`` lists its 11,689,512 parameters; this is the
network those shapes belong to (He et al. 2016, torchvision's layout): ``pstasks.models.resnet``'s
network, which the ``fashion-resnet18`` task uses with a small-image stem, given the ImageNet stem
(a 7×7 stride-2 convolution and a max-pool). Like that task's model it keeps no batch-norm
running statistics (a parameter server carries parameters, not buffers), so a worker step runs
a real forward and backward pass on any device.
"""

from __future__ import annotations

import torch
from torch import nn

from pstasks.models import resnet


class ResNet18(resnet.ResNet18):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__(in_channels=3, num_classes=num_classes)
        # Replacing the small-image stem keeps its place among the parameters (torchvision's order).
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        logits: torch.Tensor = self.fc(torch.flatten(self.avgpool(x), 1))
        return logits
