"""``GrowingRows``: per-GPU memory arrays; ``GpuKeys``: the row of each GPU (shared by the
aggregator and the hard rules)."""

from __future__ import annotations

import numpy as np

from peerwatch.streams.core.gpu_rows import (
    GpuKeys,
    GrowingRows,
    cached_gpu_keys,
    gpu_code_key,
    gpu_code_parts,
)
from peerwatch.streams.core.model import gpu_key


def test_growing_rows_fill_grow_and_keep() -> None:
    rows = GrowingRows({"ts": -1, "n": 0}, floats=["mean"])
    assert rows.add(3) == 0 and rows.size == 3
    rows.arrays["ts"][:3] = [10, 11, 12]
    assert rows.add(100) == 3 and rows.size == 103 and rows.cap >= 103
    assert rows.arrays["ts"][:5].tolist() == [10, 11, 12, -1, -1]
    assert rows.arrays["mean"].dtype == np.float64 and rows.arrays["n"].dtype == np.int64
    rows.keep(np.array([2, 0]))
    assert rows.size == rows.cap == 2 and rows.arrays["ts"].tolist() == [12, 10]
    assert rows.add(1) == 2 and rows.arrays["ts"][:3].tolist() == [12, 10, -1]


def test_gpu_keys_give_each_gpu_one_row_and_ask_for_new_ones_once() -> None:
    keys, made = GpuKeys(), []

    def add(new: np.ndarray) -> np.ndarray:
        made.append(new.tolist())
        return np.arange(sum(map(len, made)) - len(new), sum(map(len, made)))

    node, index = np.array([5, 2, 5, 2]), np.array([1, 0, 1, 7])
    first = keys.lookup(node, index, add)
    assert made == [sorted({(5 << 32) | 1, 2 << 32, (2 << 32) | 7})]  # once each, sorted
    assert first[0] == first[2] and len(set(first.tolist())) == 3
    again = keys.lookup(np.array([2, 9, 5]), np.array([0, 3, 1]), add)
    assert made[1:] == [[(9 << 32) | 3]] and again[0] == first[1] and again[2] == first[0]
    assert again[1] == 3  # the row add gave
    # a negative index keeps its own key (32 low bits), apart from every other GPU of the node
    assert gpu_code_key(np.array([1]), np.array([-1]))[0] == (1 << 32) | 0xFFFFFFFF
    # and back: every Avro int index, and the node code
    node_in, index_in = np.array([0, 7, 3, 9]), np.array([-(2**31), -1, 0, 2**31 - 1])
    node_out, index_out = gpu_code_parts(gpu_code_key(node_in, index_in))
    assert node_out.tolist() == node_in.tolist() and index_out.tolist() == index_in.tolist()
    # after a prune the owner keeps some GPUs as rows 0.. in that order
    keys.reset(gpu_code_key(np.array([9, 2]), np.array([3, 0])))
    assert keys.lookup(np.array([2, 9]), np.array([0, 3]), add).tolist() == [1, 0]
    assert len(made) == 2


def test_gpu_keys_dense_table_answers_as_the_sorted_keys_do() -> None:
    """GPUs inside the dense table's bounds and outside it (negative and large indexes, large
    node codes), mixed in one batch, before and after a prune: the same rows as a search of
    the sorted keys alone, and each GPU asked for once."""
    rng = np.random.default_rng(7)
    big_node = GpuKeys.DENSE_NODES + 3
    nodes = np.array([0, 1, 5, 40, 300, big_node], np.int64)
    indexes = np.array([0, 1, 7, 15, 16, -1, 2**31 - 1, -(2**31)], np.int64)
    keys, reference = GpuKeys(), {}

    def add(new: np.ndarray) -> np.ndarray:
        assert not set(new.tolist()) & set(reference), "a GPU asked for twice"
        rows = np.arange(len(reference), len(reference) + len(new))
        reference.update(zip(new.tolist(), rows.tolist(), strict=True))
        return rows

    for _ in range(30):
        node = rng.choice(nodes, size=int(rng.integers(1, 40)))
        index = rng.choice(indexes, size=len(node))
        got = keys.lookup(node, index, add).tolist()
        assert got == [reference[k] for k in gpu_code_key(node, index).tolist()]
    # a prune keeps some GPUs, renumbered 0..; the dropped ones are new again when they return
    kept = np.array(sorted(reference)[::2], np.int64)
    keys.reset(kept)
    reference.clear()
    reference.update((k, r) for r, k in enumerate(kept.tolist()))
    for _ in range(30):
        node = rng.choice(nodes, size=int(rng.integers(1, 40)))
        index = rng.choice(indexes, size=len(node))
        got = keys.lookup(node, index, add).tolist()
        assert got == [reference[k] for k in gpu_code_key(node, index).tolist()]
    assert keys.lookup(np.empty(0, np.int64), np.empty(0, np.int64), add).tolist() == []


def test_wide_rows_have_a_fill_per_column() -> None:
    rows = GrowingRows({"ts": -1}, wide={"acc": np.array([0, -5], np.int64)})
    rows.add(2)
    assert rows.arrays["acc"].shape[1:] == (2,) and rows.arrays["acc"][:2].tolist() == [[0, -5]] * 2
    rows.arrays["acc"][1] = [7, 8]
    rows.add(100)
    assert rows.arrays["acc"][:3].tolist() == [[0, -5], [7, 8], [0, -5]]
    rows.keep(np.array([1]))
    assert rows.arrays["acc"].tolist() == [[7, 8]]


def test_cached_gpu_keys_equal_fresh_ones_and_are_made_once_per_gpu() -> None:
    names = ["n1", "uuid-a", "n2"]
    node = np.array([2, 0, 2, 0], np.int64)
    index = np.array([1, 7, -1, 2**31 - 1], np.int64)  # Avro ints: the whole range
    fresh = cached_gpu_keys(None, names, node, index)
    assert fresh == ["n2/1", "n1/7", "n2/-1", f"n1/{2**31 - 1}"]
    assert fresh == [
        gpu_key(names[n], i) for n, i in zip(node.tolist(), index.tolist(), strict=True)
    ]
    cache: dict[int, str] = {}
    assert cached_gpu_keys(cache, names, node, index) == fresh
    assert sorted(cache) == sorted(gpu_code_key(node, index).tolist())
    # later: known GPUs come from the cache (the very same strings), a new one is made
    again = cached_gpu_keys(cache, names, np.array([0, 2, 0]), np.array([7, 1, 3]))
    assert again == ["n1/7", "n2/1", "n1/3"]
    assert again[0] is cache[(0 << 32) | 7]  # the string made the first time
    assert len(cache) == 5


def test_reserve_makes_room_without_adding_rows() -> None:
    rows = GrowingRows({"ts": -1}, wide={"acc": np.array([0, -5], np.int64)})
    rows.add(2)
    rows.arrays["ts"][:2] = [4, 5]
    rows.reserve(1000)
    assert rows.size == 2 and rows.cap == 1000 and rows.arrays["ts"][:3].tolist() == [4, 5, -1]
    assert rows.arrays["acc"].shape == (1000, 2) and rows.arrays["acc"][999].tolist() == [0, -5]
    before = rows.arrays["ts"]
    rows.add(998)  # within the room made: no copy
    assert rows.arrays["ts"] is before and rows.size == 1000
    rows.reserve(10)  # never shrinks
    assert rows.cap == 1000
