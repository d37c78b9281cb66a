"""``read_ahead``: archive blocks read by a thread ahead of the replay, in order, with the
reader's faults raised at their place and the thread stopped when the replay stops early."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from peerwatch.streams.offline.read_ahead import read_ahead


def test_items_come_in_order_from_another_thread() -> None:
    readers: set[int] = set()

    def items() -> Iterator[int]:
        for i in range(100):
            readers.add(threading.get_ident())
            yield i

    assert list(read_ahead(items(), depth=3)) == list(range(100))
    assert readers and threading.get_ident() not in readers


def test_a_fault_is_raised_after_the_items_before_it() -> None:
    def items() -> Iterator[int]:
        yield 1
        yield 2
        raise ValueError("corrupt block")

    got: list[int] = []
    with pytest.raises(ValueError, match="corrupt block"):
        for item in read_ahead(items()):
            got.append(item)
    assert got == [1, 2]


def test_stopping_early_ends_the_thread_and_closes_the_source() -> None:
    closed = threading.Event()

    def items() -> Iterator[int]:
        try:
            yield from range(10_000)
        finally:
            closed.set()

    before = threading.active_count()
    ahead = read_ahead(items(), depth=2)
    assert [next(ahead) for _ in range(3)] == [0, 1, 2]
    ahead.close()  # the replay stopped (an error downstream, or a --to reached)
    assert closed.is_set() and threading.active_count() == before
