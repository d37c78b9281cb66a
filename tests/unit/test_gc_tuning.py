"""The collector thresholds the worker, its hot process and replay set (peerwatch/gc_tuning.py)."""

from __future__ import annotations

import gc

from peerwatch import gc_tuning


def test_tune_sets_the_thresholds_of_this_process() -> None:
    before = gc.get_threshold()
    try:
        gc_tuning.tune()
        assert gc.get_threshold() == gc_tuning.THRESHOLDS
        assert gc_tuning.THRESHOLDS[0] > 700  # CPython's default for the youngest generation
        assert gc.isenabled()  # cycles are still collected
    finally:
        gc.set_threshold(*before)
