"""The cyclic garbage collector's thresholds for the long-running, allocation-heavy processes:
the stream worker, its hot process and replay.

CPython scans its youngest generation every 700 net allocations of container objects. Stage 3
makes a dict per GPU window and keeps many for a few seconds (windows pending release, the
detector's per-GPU state), so with that default most of them are scanned, promoted and scanned
again before they are freed or settle. A youngest generation of 50,000 lets the short-lived ones
die first; the older generations are collected as often as before relative to it. Reference
counting frees everything else at once as usual, and cyclic garbage is still collected.
Measured with ``scripts/bench_stage3.py`` and ``peerwatch replay`` (docs/performance.md).
"""

from __future__ import annotations

import gc

#: (youngest, middle, oldest) generation thresholds (``gc.set_threshold``).
THRESHOLDS = (50_000, 10, 10)


def tune() -> None:
    """Set :data:`THRESHOLDS` for this process."""
    gc.set_threshold(*THRESHOLDS)
