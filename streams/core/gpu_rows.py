"""Per-GPU rows over column batches: what the window aggregator and the hard rules on arrival
share (:mod:`~peerwatch.streams.core.windows`, :mod:`~peerwatch.streams.core.hard_watch`).

Both name a GPU by its node's string code and its index and give it a row (:class:`GpuKeys`),
and keep, for each GPU, what its last reading left (time, counters, flags) in named arrays with
one row per GPU (:class:`GrowingRows`); their loops over a batch's readings
(:mod:`~peerwatch.streams.core.loops`) compare each reading with that memory.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from peerwatch.streams.core.model import gpu_keys

__all__ = ["GpuKeys", "GrowingRows", "cached_gpu_keys", "gpu_code_key", "gpu_code_parts"]


def gpu_code_key(node: np.ndarray, index: np.ndarray) -> np.ndarray:
    """One int64 per GPU: its node's string code above, its GPU index below (32 bits each)."""
    key: np.ndarray = (node.astype(np.int64) << 32) | (index.astype(np.int64) & 0xFFFFFFFF)
    return key


def gpu_code_parts(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The node string codes and GPU indexes of :func:`gpu_code_key` keys (its inverse)."""
    low = key & 0xFFFFFFFF
    index: np.ndarray = np.where(low >= 1 << 31, low - (1 << 32), low)
    node: np.ndarray = key >> 32
    return node, index


def cached_gpu_keys(
    cache: dict[int, str] | None, names: Sequence[str], node: np.ndarray, index: np.ndarray
) -> list[str]:
    """:func:`~peerwatch.streams.core.model.gpu_key` of each GPU (node string codes into
    ``names``, GPU indexes: Avro ints, so :func:`gpu_code_key` tells every pair apart), made
    once per GPU into ``cache`` (by GPU code; codes never change meaning, the string table only
    grows) and looked up after; ``cache`` None: all made afresh."""
    if cache is None:
        return gpu_keys(map(names.__getitem__, node.tolist()), index.tolist())
    codes = gpu_code_key(node, index).tolist()
    keys = list(map(cache.get, codes))
    if None in keys:
        new = [i for i, k in enumerate(keys) if k is None]
        made = gpu_keys([names[c] for c in node[new].tolist()], index[new].tolist())
        for i, key in zip(new, made, strict=True):
            keys[i] = cache[codes[i]] = key
    return keys  # type: ignore[return-value]  # every None replaced


class GpuKeys:
    """The row of each GPU (:func:`gpu_code_key`) in its owner's per-GPU arrays, looked up a
    batch at a time: keys sorted with their rows (every GPU), and a dense table by node code
    and GPU index for the usual GPUs (index below :attr:`DENSE_INDEXES`, node code below
    :attr:`DENSE_NODES`), which answers a batch with one gather where a sorted search took a
    dozen probes a reading. The sorted keys decide; the table only repeats what they hold."""

    #: GPU indexes ``0 .. DENSE_INDEXES - 1`` are in the dense table (others: sorted keys only)
    DENSE_INDEXES = 16
    #: node string codes below this are in the dense table (bounds it: 32 MiB at most)
    DENSE_NODES = 1 << 18

    def __init__(self) -> None:
        self.keys = np.empty(0, np.int64)  # sorted ...
        self.rows = np.empty(0, np.int64)  # ... and the row of each
        self._dense = np.full((0, self.DENSE_INDEXES), -1, np.int64)  # row, -1: ask the keys

    def lookup(
        self, node: np.ndarray, index: np.ndarray, add: Callable[[np.ndarray], np.ndarray]
    ) -> np.ndarray:
        """The row of each GPU (node string code, GPU index); ``add`` makes rows for the GPUs
        not seen before (given as :func:`gpu_code_key` keys, once each, sorted) and returns
        them."""
        if not len(node):
            return np.empty(0, np.int64)
        dense = self._dense
        if (
            int(index.min()) >= 0
            and int(index.max()) < self.DENSE_INDEXES
            and int(node.min()) >= 0
            and int(node.max()) < len(dense)
        ):
            # one gather on the flat table: half the time of indexing it by (node, index)
            rows: np.ndarray = dense.reshape(-1)[node * self.DENSE_INDEXES + index]
            if int(rows.min()) >= 0:
                return rows
        return self._sorted_lookup(node, index, add)

    def _sorted_lookup(
        self, node: np.ndarray, index: np.ndarray, add: Callable[[np.ndarray], np.ndarray]
    ) -> np.ndarray:
        key = gpu_code_key(node, index)
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
        self._note_dense(node.astype(np.int64, copy=False), index.astype(np.int64, copy=False),
                         out)  # fmt: skip
        return out

    def _note_dense(self, node: np.ndarray, index: np.ndarray, rows: np.ndarray) -> None:
        """Rows of GPUs inside the dense table's bounds into it (grown to the codes seen)."""
        inside = (node >= 0) & (node < self.DENSE_NODES) & (index >= 0)
        inside &= index < self.DENSE_INDEXES
        if not inside.any():
            return
        node, index, rows = node[inside], index[inside], rows[inside]
        need = int(node.max()) + 1
        if need > len(self._dense):
            size = min(max(need, 2 * len(self._dense), 64), self.DENSE_NODES)
            grown = np.full((size, self.DENSE_INDEXES), -1, np.int64)
            grown[: len(self._dense)] = self._dense
            self._dense = grown
        self._dense[node, index] = rows

    def reset(self, keys: np.ndarray) -> None:
        """The rows are now ``0 .. len(keys) - 1``, row ``r`` for ``keys[r]`` (after a prune)."""
        order = np.argsort(keys, kind="stable")
        self.keys, self.rows = keys[order], order.astype(np.int64)
        self._dense[:] = -1
        self._note_dense(*gpu_code_parts(keys), np.arange(len(keys), dtype=np.int64))


class GrowingRows:
    """Named int64/float64 arrays, one row each, that grow together (amortised doubling); new
    rows hold each array's fill value. A ``wide`` array has several columns per row, each with
    its own fill (the fill row's dtype is the array's)."""

    def __init__(self, ints: Mapping[str, int], floats: Sequence[str] = (),
                 wide: Mapping[str, np.ndarray] | None = None) -> None:  # fmt: skip
        self.size = 0
        self.cap = 0
        self.fill: dict[str, Any] = {**ints, **dict.fromkeys(floats, 0.0)}
        self.arrays: dict[str, np.ndarray] = {
            k: np.empty(0, np.float64 if k in floats else np.int64) for k in self.fill
        }
        for k, row in (wide or {}).items():
            self.fill[k] = np.asarray(row)
            self.arrays[k] = np.empty((0, len(row)), self.fill[k].dtype)

    def add(self, count: int) -> int:
        """Append ``count`` rows at their fill values; returns the first new row."""
        first = self.size
        need = first + count
        if need > self.cap:
            self.reserve(max(need, 2 * self.cap, 64))
        self.size = need
        return first

    def reserve(self, rows: int) -> None:
        """Room for ``rows`` rows in all (no more growing until then); the rows stay
        ``size``."""
        if rows <= self.cap:
            return
        size = self.size
        for k, a in self.arrays.items():
            grown = np.empty((rows, *a.shape[1:]), a.dtype)
            grown[size:] = self.fill[k]
            grown[:size] = a[:size]
            self.arrays[k] = grown
        self.cap = rows

    def keep(self, rows: np.ndarray) -> None:
        """Only ``rows`` stay (in that order)."""
        for k, a in self.arrays.items():
            self.arrays[k] = a[rows]
        self.size = self.cap = len(rows)
