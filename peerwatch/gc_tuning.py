"""The cyclic garbage collector's thresholds for the long-running, allocation-heavy processes:
the stream worker, its hot process and replay.

CPython scans its youngest generation every 700 net allocations of container objects. Stage 3
makes a dict per GPU window and keeps many for a few seconds (windows pending release, the
detector's per-GPU state), so with that default most of them are scanned, promoted and scanned
again before they are freed or settle. A youngest generation of 100,000 (a window start's
dicts of a 2,500-node fleet, and the windows held pending) lets the short-lived ones die first,
and the middle and oldest generations are scanned rarely (after 50 and 50 x 100 young scans):
what lives on is the detector's state, which is not garbage. Reference counting frees
everything else at once as usual, and cyclic garbage is still collected. Measured with
``scripts/bench_stage3.py`` and ``peerwatch replay`` (docs/performance.md): replay's stages
process spent 1.4-1.7 s of about 21 CPU-s collecting over a 1,500,000-record archive with
(50,000, 10, 10), 0.06 s with these.
"""

from __future__ import annotations

import gc

#: (youngest, middle, oldest) generation thresholds (``gc.set_threshold``).
THRESHOLDS = (100_000, 50, 100)


def tune() -> None:
    """Set :data:`THRESHOLDS` for this process."""
    gc.set_threshold(*THRESHOLDS)
