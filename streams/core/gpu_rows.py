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

__all__ = ["GpuKeys", "GrowingRows", "cached_gpu_keys", "gpu_code_key"]


def gpu_code_key(node: np.ndarray, index: np.ndarray) -> np.ndarray:
    """One int64 per GPU: its node's string code above, its GPU index below (32 bits each)."""
    key: np.ndarray = (node.astype(np.int64) << 32) | (index.astype(np.int64) & 0xFFFFFFFF)
    return key


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
            cap = max(need, 2 * self.cap, 64)
            for k, a in self.arrays.items():
                grown = np.empty((cap, *a.shape[1:]), a.dtype)
                grown[first:] = self.fill[k]
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
