"""Per-GPU memory over column batches: what the window aggregator and the hard rules on arrival
share (:mod:`~peerwatch.streams.core.windows`, :mod:`~peerwatch.streams.core.hard_watch`).

Both name a GPU by its node's string code and its index and give it a row (:class:`GpuKeys`),
keep, for each GPU, what its last reading left (time, counters, flags) in named arrays with one
row per GPU (:class:`GrowingRows`), and both compare each reading of a batch with the one
before it of the same GPU. :func:`gpu_runs` lays a batch out for that: each GPU's readings in
arrival order behind one element holding the GPU's memory, and which of them move the GPU's
clock on (a reading no later than an earlier one of its GPU does not).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["GpuKeys", "GpuRuns", "GrowingRows", "counter_delta", "gpu_code_key", "gpu_runs"]


def counter_delta(new: np.ndarray, old: np.ndarray) -> np.ndarray:
    """Counter increase; a counter that went down was reset and restarts at zero."""
    out: np.ndarray = np.where(new >= old, new - old, new)
    return out


def gpu_code_key(node: np.ndarray, index: np.ndarray) -> np.ndarray:
    """One int64 per GPU: its node's string code above, its GPU index below (32 bits each)."""
    key: np.ndarray = (node.astype(np.int64) << 32) | (index.astype(np.int64) & 0xFFFFFFFF)
    return key


class GpuKeys:
    """The row of each GPU (:func:`gpu_code_key`) in its owner's per-GPU arrays: keys sorted, with
    their rows, looked up a batch at a time."""

    def __init__(self) -> None:
        self.keys = np.empty(0, np.int64)  # sorted ...
        self.rows = np.empty(0, np.int64)  # ... and the row of each

    def lookup(self, key: np.ndarray, add: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        """The row of each key; ``add`` makes rows for the keys not seen before (given once each,
        sorted) and returns them."""
        pos = np.searchsorted(self.keys, key)
        n = len(self.keys)
        if n:
            known = (pos < n) & (self.keys[np.minimum(pos, n - 1)] == key)
        else:
            known = np.zeros(len(key), np.bool_)
        if not known.all():
            new = np.unique(key[~known])
            keys = np.concatenate([self.keys, new])
            order = np.argsort(keys, kind="stable")
            self.keys = keys[order]
            self.rows = np.concatenate([self.rows, add(new)])[order]
            pos = np.searchsorted(self.keys, key)
        out: np.ndarray = self.rows[pos]
        return out

    def reset(self, keys: np.ndarray) -> None:
        """The rows are now ``0 .. len(keys) - 1``, row ``r`` for ``keys[r]`` (after a prune)."""
        order = np.argsort(keys, kind="stable")
        self.keys, self.rows = keys[order], order.astype(np.int64)


class GrowingRows:
    """Named int64/float64 arrays, one row each, that grow together (amortised doubling); new
    rows hold each array's fill value."""

    def __init__(self, ints: Mapping[str, int], floats: Sequence[str] = ()) -> None:
        self.size = 0
        self.cap = 0
        self.fill: dict[str, Any] = {**ints, **dict.fromkeys(floats, 0.0)}
        self.arrays: dict[str, np.ndarray] = {
            k: np.empty(0, np.float64 if k in floats else np.int64) for k in self.fill
        }

    def add(self, count: int) -> int:
        """Append ``count`` rows at their fill values; returns the first new row."""
        first = self.size
        need = first + count
        if need > self.cap:
            cap = max(need, 2 * self.cap, 64)
            for k, a in self.arrays.items():
                grown = np.full(cap, self.fill[k], a.dtype)
                grown[:first] = a[:first]
                self.arrays[k] = grown
            self.cap = cap
        self.size = need
        return first

    def keep(self, rows: np.ndarray) -> None:
        """Only ``rows`` stay (in that order)."""
        for k, a in self.arrays.items():
            self.arrays[k] = a[rows]
        self.size = self.cap = len(rows)


@dataclass(frozen=True, slots=True)
class GpuRuns:
    """A batch of ``m`` readings laid out as ``size`` elements: for each GPU (``groups``, in
    ascending order) one memory element at ``head_pos``, then its readings in arrival order.
    ``order`` sorts the readings by GPU (stable); ``pos[i]`` is the element of the ``i``-th
    reading in that order. ``ts`` is each element's time (the memory's for a memory element);
    ``moves`` whether it moves its GPU's clock on (always for a memory element); ``in_order``
    that every element does (the usual case)."""

    order: np.ndarray
    groups: np.ndarray
    pos: np.ndarray
    head_pos: np.ndarray
    size: int
    ts: np.ndarray
    moves: np.ndarray
    in_order: bool

    def spread(self, x: np.ndarray, memory: Any, dtype: Any = np.int64) -> np.ndarray:
        """The elements' values: ``x`` per reading (arrival order), ``memory`` per GPU."""
        out = np.empty(self.size, dtype)
        out[self.pos] = x[self.order]
        out[self.head_pos] = memory
        return out


def gpu_runs(gid: np.ndarray, ts: np.ndarray, memory_ts: np.ndarray) -> GpuRuns:
    """Lay out readings of GPUs ``gid`` at times ``ts`` (both per reading, arrival order)
    behind their GPUs' memory; ``memory_ts[gid]`` is a GPU's last time. At least one reading."""
    m = len(gid)
    order = np.argsort(gid, kind="stable")
    sorted_gid = gid[order]
    heads = np.flatnonzero(np.r_[True, sorted_gid[1:] != sorted_gid[:-1]])
    groups = sorted_gid[heads]
    size = m + len(heads)
    pos = np.arange(m) + np.searchsorted(heads, np.arange(m), side="right")  # after its head
    head_pos = heads + np.arange(len(heads))
    t = np.empty(size, np.int64)
    t[pos] = ts[order]
    t[head_pos] = memory_ts[groups]
    if bool(np.all(t[pos] > t[pos - 1])):
        # The usual case: every reading moves its GPU's clock on.
        moves = np.ones(size, np.bool_)
        return GpuRuns(order, groups, pos, head_pos, size, t, moves, True)
    group = np.repeat(np.arange(len(heads)), np.diff(np.r_[head_pos, size]))
    # the running maximum of the clock within each group (ranks keep the keys small)
    uniq, rank = np.unique(t, return_inverse=True)
    span = size + 1
    running = uniq[np.maximum.accumulate(group * span + rank) - group * span]
    moves = np.empty(size, np.bool_)
    moves[1:] = t[1:] > running[:-1]
    moves[head_pos] = True  # the memory itself
    return GpuRuns(order, groups, pos, head_pos, size, t, moves, False)
