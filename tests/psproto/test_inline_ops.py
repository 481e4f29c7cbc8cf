"""inline_torch_ops: chunk-sized torch operations on the calling thread, other threads untouched."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from psproto.inline_ops import inline_each, inline_torch_ops


def _count_on_another_thread() -> int:
    seen: list[int] = []
    thread = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
    thread.start()
    thread.join()
    return seen[0]


@pytest.mark.usefixtures("two_threads")
def test_the_guard_gives_this_thread_one_thread_and_puts_its_count_back() -> None:
    with inline_torch_ops():
        assert torch.get_num_threads() == 1
        assert _count_on_another_thread() == 2  # threads started meanwhile keep the process's count
        x = torch.arange(100_000, dtype=torch.float32)
        assert float(x.add(1).sum()) == pytest.approx(100_000 * 100_001 / 2)
    assert torch.get_num_threads() == 2


@pytest.mark.usefixtures("two_threads")
def test_a_thread_elsewhere_keeps_its_count_while_one_holds_the_guard() -> None:
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        with inline_torch_ops():
            inside.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert inside.wait(10)
    assert torch.get_num_threads() == 2
    release.set()
    holder.join()


@pytest.mark.usefixtures("two_threads")
def test_each_item_is_made_with_one_thread_and_the_consumer_keeps_its_count() -> None:
    def made() -> Iterator[int]:
        for _ in range(3):
            yield torch.get_num_threads()

    seen_by_consumer = []
    items = []
    for item in inline_each(made()):
        items.append(item)
        seen_by_consumer.append(torch.get_num_threads())
    assert items == [1, 1, 1] and seen_by_consumer == [2, 2, 2]


def test_with_one_thread_already_the_guard_changes_nothing() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with inline_torch_ops():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
