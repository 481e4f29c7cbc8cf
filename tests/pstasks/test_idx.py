"""The IDX reader on small files written here: good ones (gzipped and plain) and each malformed kind."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import pytest
import torch

from pstasks.fashion import FILES, HOW_TO_GET, load_fashion
from pstasks.idx import IMAGES_MAGIC, LABELS_MAGIC, IdxError, find_idx, read_idx, read_images_and_labels


def idx_bytes(magic: int, shape: tuple[int, ...], values: bytes) -> bytes:
    return struct.pack(f">I{len(shape)}I", magic, *shape) + values


def write(path: Path, data: bytes, gzipped: bool) -> Path:
    path.write_bytes(gzip.compress(data) if gzipped else data)
    return path


def images(count: int, rows: int = 28, cols: int = 28) -> tuple[tuple[int, ...], bytes]:
    values = bytes((i * 7) % 256 for i in range(count * rows * cols))
    return (count, rows, cols), values


def write_dataset(directory: Path, train: int = 6, test: int = 4, gzipped: bool = True) -> None:
    suffix = ".gz" if gzipped else ""
    for split, count in (("train", train), ("test", test)):
        images_name, labels_name = FILES[split]
        shape, values = images(count)
        write(directory / f"{images_name}{suffix}", idx_bytes(IMAGES_MAGIC, shape, values), gzipped)
        labels = bytes(i % 10 for i in range(count))
        write(directory / f"{labels_name}{suffix}", idx_bytes(LABELS_MAGIC, (count,), labels), gzipped)


@pytest.mark.parametrize("gzipped", [True, False])
def test_good_files_read_to_the_header_shape(tmp_path: Path, gzipped: bool) -> None:
    shape, values = images(3, 4, 5)
    path = write(tmp_path / "x-idx3-ubyte", idx_bytes(IMAGES_MAGIC, shape, values), gzipped)
    tensor = read_idx(path, IMAGES_MAGIC)
    assert tensor.dtype == torch.uint8
    assert tensor.shape == (3, 4, 5)
    assert tensor.flatten().tolist() == list(values)


def test_find_idx_prefers_gz_and_falls_back_to_plain(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"")
    assert find_idx(tmp_path, "a") == tmp_path / "a"
    (tmp_path / "a.gz").write_bytes(b"")
    assert find_idx(tmp_path, "a") == tmp_path / "a.gz"


@pytest.mark.parametrize("gzipped", [True, False])
def test_a_whole_dataset_loads_normalised(tmp_path: Path, gzipped: bool) -> None:
    write_dataset(tmp_path, gzipped=gzipped)
    data = load_fashion(tmp_path)
    assert data.train_inputs.shape == (6, 1, 28, 28)
    assert data.train_inputs.dtype == torch.float32
    assert data.test_targets.tolist() == [0, 1, 2, 3]


def test_the_data_dir_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_dataset(tmp_path)
    monkeypatch.setenv("HETPS_DATA_DIR", str(tmp_path))
    assert load_fashion().train_targets.shape == (6,)


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        (idx_bytes(LABELS_MAGIC, (2, 28, 28), b"\0" * 2 * 28 * 28), "bad magic number"),
        (idx_bytes(IMAGES_MAGIC, (2, 28, 28), b"\0" * 1000), "truncated: 1000 of the 1568"),
        (idx_bytes(IMAGES_MAGIC, (2, 28, 28), b"\0" * 1569), "longer than its header"),
        (struct.pack(">I", IMAGES_MAGIC) + b"\0\0\0\2", "truncated: the header's 3 dimensions"),
        (b"\0\0", "shorter than an IDX header"),
    ],
)
@pytest.mark.parametrize("gzipped", [True, False])
def test_malformed_files_name_the_file_and_the_problem(
    tmp_path: Path, data: bytes, problem: str, gzipped: bool
) -> None:
    path = write(tmp_path / "bad-idx3-ubyte", data, gzipped)
    with pytest.raises(IdxError, match=problem) as raised:
        read_idx(path, IMAGES_MAGIC, HOW_TO_GET)
    message = str(raised.value)
    assert message.startswith(f"{path}: ")
    assert "apt-get install dataset-fashion-mnist" in message
    assert "\n" not in message


def test_a_corrupt_gzip_file_is_named(tmp_path: Path) -> None:
    path = tmp_path / "x.gz"
    path.write_bytes(gzip.compress(idx_bytes(LABELS_MAGIC, (100,), bytes(100)))[:20])
    with pytest.raises(IdxError, match=str(path)):
        read_idx(path, LABELS_MAGIC)


def test_image_and_label_counts_that_differ_name_the_labels_file(tmp_path: Path) -> None:
    shape, values = images(3)
    images_path = write(tmp_path / "i-idx3-ubyte", idx_bytes(IMAGES_MAGIC, shape, values), False)
    labels_path = write(tmp_path / "l-idx1-ubyte", idx_bytes(LABELS_MAGIC, (2,), b"\1\2"), False)
    with pytest.raises(IdxError, match="2 labels for the 3 images of i-idx3-ubyte") as raised:
        read_images_and_labels(images_path, labels_path)
    assert raised.value.path == labels_path


def test_a_missing_file_is_named_with_how_to_get_the_data(tmp_path: Path) -> None:
    write_dataset(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(IdxError) as raised:
        load_fashion(tmp_path)
    message = str(raised.value)
    assert message.startswith(f"{tmp_path / 't10k-labels-idx1-ubyte'}[.gz]: not found;")
    assert "apt-get install dataset-fashion-mnist" in message
    assert "--data-dir" in message


def test_a_missing_directory_says_so(tmp_path: Path) -> None:
    with pytest.raises(IdxError, match="there is no directory"):
        load_fashion(tmp_path / "nowhere")
