"""The Fashion-MNIST tasks: where the files are, reading them, and the ``fashion`` CNN.

The four standard IDX files (60,000 training and 10,000 test 28×28 grey images, 10 classes)
come from ``--data-dir``, else ``$HETPS_DATA_DIR``, else ``/usr/share/datasets/fashion-mnist``,
where Debian's package ``dataset-fashion-mnist`` installs them; gzipped or plain. Nothing is
downloaded: files that are missing or malformed raise :class:`pstasks.idx.IdxError`, whose
message names the file, the problem and how to get the data.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from pstasks.idx import find_idx, read_images_and_labels

DATA_DIR_ENV = "HETPS_DATA_DIR"
DEFAULT_DATA_DIR = Path("/usr/share/datasets/fashion-mnist")
FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
HOW_TO_GET = (
    "install Fashion-MNIST with `apt-get install dataset-fashion-mnist`, or point --data-dir "
    f"(or ${DATA_DIR_ENV}) at a directory holding its four IDX files"
)
# The training set's pixel mean and standard deviation (of values scaled to [0, 1]).
PIXEL_MEAN = 0.2860
PIXEL_STD = 0.3530


def data_dir_or_default(data_dir: Path | None = None) -> Path:
    """``data_dir`` if given, else ``$HETPS_DATA_DIR`` if set, else the Debian package's directory."""
    if data_dir is not None:
        return data_dir
    from_env = os.environ.get(DATA_DIR_ENV)
    return Path(from_env) if from_env else DEFAULT_DATA_DIR


@dataclass
class FashionData:
    """Normalised float images (N×1×28×28) and int64 labels of both splits."""

    train_inputs: torch.Tensor
    train_targets: torch.Tensor
    test_inputs: torch.Tensor
    test_targets: torch.Tensor


def _split(directory: Path, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    images_name, labels_name = FILES[split]
    images, labels = read_images_and_labels(
        find_idx(directory, images_name, HOW_TO_GET), find_idx(directory, labels_name, HOW_TO_GET), HOW_TO_GET
    )
    inputs = images.unsqueeze(1).to(torch.float32).div_(255.0).sub_(PIXEL_MEAN).div_(PIXEL_STD)
    return inputs, labels.to(torch.long)


def load_fashion(data_dir: Path | None = None) -> FashionData:
    """Both splits from ``data_dir`` (or the default location; see :func:`data_dir_or_default`)."""
    directory = data_dir_or_default(data_dir)
    train_inputs, train_targets = _split(directory, "train")
    test_inputs, test_targets = _split(directory, "test")
    return FashionData(train_inputs, train_targets, test_inputs, test_targets)


class FashionCNN(nn.Module):
    """Two conv-pool stages (32 and 64 channels) and a 128-unit layer (about 420k parameters).

    No batch normalisation: its running statistics would be buffers, which the server does not
    carry, so a model pulled from the server would evaluate with the wrong ones.
    """

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))  # type: ignore[no-any-return]
