"""``gpu_runs``: a batch's readings behind their GPUs' memory, and which move each GPU's clock
on; ``GrowingRows``: per-GPU memory arrays; ``GpuKeys``: the row of each GPU (shared by the
aggregator and the hard rules)."""

from __future__ import annotations

import numpy as np

from peerwatch.streams.core.gpu_runs import (
    GpuKeys,
    GrowingRows,
    counter_delta,
    gpu_code_key,
    gpu_runs,
)


def test_readings_in_order_sit_behind_their_gpus_memory() -> None:
    gid = np.array([2, 0, 2, 0, 5])
    ts = np.array([10, 11, 12, 13, 14])
    memory_ts = np.array([5, -1, 9, -1, -1, 1])  # by gid
    runs = gpu_runs(gid, ts, memory_ts)
    assert runs.in_order and runs.size == 8 and runs.moves.all()
    assert runs.groups.tolist() == [0, 2, 5]
    assert runs.head_pos.tolist() == [0, 3, 6]
    # elements: [mem 0, r1, r3, mem 2, r0, r2, mem 5, r4]
    assert runs.ts.tolist() == [5, 11, 13, 9, 10, 12, 1, 14]
    assert runs.spread(np.arange(5) * 100, -7).tolist() == [-7, 100, 300, -7, 0, 200, -7, 400]
    element_of_reading = runs.pos[np.argsort(runs.order)]
    assert element_of_reading.tolist() == [4, 1, 5, 2, 7]


def test_a_reading_no_later_than_an_earlier_one_of_its_gpu_does_not_move_the_clock() -> None:
    gid = np.array([1, 1, 1, 1, 0])
    ts = np.array([20, 15, 20, 25, 3])  # 15 is older than 20, the second 20 equal
    memory_ts = np.array([4, 10])
    runs = gpu_runs(gid, ts, memory_ts)
    assert not runs.in_order
    # elements: [mem 0, r4 (3 < 4)], [mem 1, r0, r1, r2, r3]
    assert runs.ts.tolist() == [4, 3, 10, 20, 15, 20, 25]
    assert runs.moves.tolist() == [True, False, True, True, False, False, True]


def test_older_than_the_memory_only() -> None:
    runs = gpu_runs(np.array([0]), np.array([7]), np.array([9]))
    assert not runs.in_order and runs.moves.tolist() == [True, False]


def test_counter_delta_restarts_at_a_reset() -> None:
    assert counter_delta(np.array([5, 3, 9]), np.array([2, 8, 9])).tolist() == [3, 3, 0]


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
    first = keys.lookup(gpu_code_key(node, index), add)
    assert made == [sorted({(5 << 32) | 1, 2 << 32, (2 << 32) | 7})]  # once each, sorted
    assert first[0] == first[2] and len(set(first.tolist())) == 3
    again = keys.lookup(gpu_code_key(np.array([2, 9, 5]), np.array([0, 3, 1])), add)
    assert made[1:] == [[(9 << 32) | 3]] and again[0] == first[1] and again[2] == first[0]
    assert again[1] == 3  # the row add gave
    # a negative index keeps its own key (32 low bits), apart from every other GPU of the node
    assert gpu_code_key(np.array([1]), np.array([-1]))[0] == (1 << 32) | 0xFFFFFFFF
    # after a prune the owner keeps some GPUs as rows 0.. in that order
    keys.reset(gpu_code_key(np.array([9, 2]), np.array([3, 0])))
    assert keys.lookup(gpu_code_key(np.array([2, 9]), np.array([0, 3])), add).tolist() == [1, 0]
    assert len(made) == 2
