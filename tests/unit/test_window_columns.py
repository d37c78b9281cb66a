"""The detector's columns of a job window: the aggregator's (made from its arrays with the dicts)
equal those read back from the dicts (window_columns.of_windows), and the detector gives the same
findings, windows and state from either; stage 3 holds an aggregator batch whole and falls back
to keying its dicts when another batch of the window comes or a GPU is in it twice."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

from peerwatch.streams.core.detector import detect_job_window
from peerwatch.streams.core.detector_state import JobDetectorState
from peerwatch.streams.core.job_stage import JobStage
from peerwatch.streams.core.model import JobContext, gpu_key, gpu_keys
from peerwatch.streams.core.settings import DetectorSettings
from peerwatch.streams.core.window_columns import (
    FLOAT_FIELDS,
    WindowColumns,
    float_column,
    of_windows,
)
from peerwatch.streams.core.windows import JobWindowBatch, WindowAggregator
from tests.unit.test_windows import T0, S, reading, sample, table

SETTINGS = DetectorSettings(window_s=30)


def _aggregated(seconds: int = 30 * 8) -> list[JobWindowBatch]:
    """The batches of :func:`aggregator`'s windows."""
    return aggregator(seconds).flush()


def aggregator(seconds: int = 30 * 8) -> WindowAggregator:
    """An aggregator holding windows of two jobs on two nodes, with the cases the columns must get right: a lost GPU,
    a GPU without readings of some fields, a PCIe width drop, an ECC rise, an XID, remap
    pending, a slow clock, throttling, and a sample-less field (step_ms)."""
    gpus = list(range(8))
    a = WindowAggregator(
        table(("J", T0 - 600 * S, None, {"n1": gpus, "n2": gpus[:4]}),
              ("K", T0 - 600 * S, None, {"n2": gpus[4:]})),
        30, 10,
    )  # fmt: skip
    normal = {"pcie_link_width": 16, "pcie_link_width_max": 16, "ecc_volatile_uncorrected": 0,
              "sm_clock_mhz": 1900, "sm_clock_max_mhz": 1980, "sm_active_pct": 90.0,
              "power_mw": 600_000, "power_limit_mw": 700_000}  # fmt: skip
    for k in range(seconds):
        for node in ("n1", "n2"):
            readings = [reading(i, **normal) for i in gpus]
            if node == "n1":
                readings[1] = reading(1, **{**normal, "sm_clock_mhz": 1700})  # slow
                readings[2] = reading(2, **{**normal, "pcie_link_width": 8})
                readings[3] = reading(3, **{**normal, "ecc_volatile_uncorrected": k // 60})
                readings[4] = reading(4)  # no field besides its identity
                readings[5] = reading(5, state="LOST")
                readings[6] = reading(6, **{**normal, "clocks_event_reasons": 0x40})
            else:
                readings[7] = reading(7, **{**normal, "remap_pending": int(k > 100)})
            xids = [{"gpu_index": 0, "xid": 79, "ts_ms": T0 + k * S}] if k == 95 else []
            a.add_batch([sample(T0 + k * S, *readings, node=node, xids=xids)])
    return a


def _same(made: WindowColumns, read: WindowColumns) -> None:
    assert made.keys == read.keys
    assert made.reports.tolist() == read.reports.tolist()
    assert made.fires.tolist() == read.fires.tolist()
    for name in FLOAT_FIELDS:
        a, b = made.column(name), read.column(name)
        np.testing.assert_array_equal(a.values, b.values)  # NaN where None, on both sides
        assert (a.nan_given is None or not a.nan_given.any()) == (b.nan_given is None)


def test_the_aggregators_columns_equal_those_read_from_its_dicts() -> None:
    batches = _aggregated()
    assert len(batches) == 2 * 8 and all(b.columns is not None for b in batches)
    seen_fire = seen_lost = False
    for b in batches:
        assert b.columns is not None
        ws = b.windows
        keys = gpu_keys((w["node"] for w in ws), (w["gpu_index"] for w in ws))
        assert keys == [gpu_key(w["node"], w["gpu_index"]) for w in ws]
        read = of_windows(ws, keys, [w["lost"] for w in ws], [w["samples"] for w in ws])
        _same(b.columns, read)
        seen_fire |= bool(b.columns.fires.any())
        seen_lost |= not bool(b.columns.reports.all())
    assert seen_fire and seen_lost  # the cases above are in it


def test_the_detector_reads_the_same_from_columns_and_from_dicts() -> None:
    batches = _aggregated()
    plain = copy.deepcopy(batches)
    by_columns: dict[str, JobDetectorState] = {}
    by_dicts: dict[str, JobDetectorState] = {}
    statuses: set[str] = set()
    for b, p in zip(batches, plain, strict=True):
        ctx = JobContext(job_id=b.job_id)
        s1 = by_columns.setdefault(b.job_id, JobDetectorState(job_id=b.job_id))
        s2 = by_dicts.setdefault(b.job_id, JobDetectorState(job_id=b.job_id))
        r1 = detect_job_window(ctx, b.windows, s1, SETTINGS, "copies", b.columns)
        r2 = detect_job_window(ctx, p.windows, s2, SETTINGS, "copies")
        assert r1.findings == r2.findings and r1.windows == r2.windows
        assert r1.gated == r2.gated and r1.recorded_xids == r2.recorded_xids
        statuses |= {f["status"] for f in r1.findings}
    assert {"HARD_ERROR", "SUSPECT"} <= statuses  # the hard faults and the slow GPU
    assert {j: s.to_dict() for j, s in by_columns.items()} == {
        j: s.to_dict() for j, s in by_dicts.items()
    }
    assert any(r for r in by_columns["J"].gpus.values() if r.hard_last_ms)  # XID, ECC, PCIe


def test_a_nan_given_is_told_from_a_none() -> None:
    col = float_column([1.0, None, float("nan")])
    assert np.isnan(col.values[1]) and col.nan_given is not None
    assert col.nan_given.tolist() == [False, False, True]
    assert float_column([1.0, None]).nan_given is None
    assert float_column([1.0, None]).present() == [1.0]


def _batch(start: int, ws: list[dict[str, Any]], columns: WindowColumns | None) -> JobWindowBatch:
    return JobWindowBatch("J", start, start + 30 * S, ws, columns)


def _columns(ws: list[dict[str, Any]]) -> WindowColumns:
    keys = gpu_keys((w["node"] for w in ws), (w["gpu_index"] for w in ws))
    return of_windows(ws, keys, [w["lost"] for w in ws], [w["samples"] for w in ws])


@pytest.mark.parametrize("case", ["whole", "second_batch", "gpu_twice"])
def test_stage_three_holds_a_batch_whole_unless_it_must_key_it(case: str) -> None:
    ws = next(b for b in _aggregated(30) if b.job_id == "J").windows
    stage = JobStage(SETTINGS, scored_windows=False)
    stage_plain = JobStage(SETTINGS, scored_windows=False)
    first = ws if case != "gpu_twice" else [*ws, dict(ws[-1], clk_ratio=0.5)]
    stage.add(_batch(ws[0]["window_start_ms"], first, _columns(first)))
    stage_plain.add(_batch(ws[0]["window_start_ms"], copy.deepcopy(first), None))
    if case == "second_batch":
        extra = [dict(ws[0], node="n9")]
        stage.add(_batch(ws[0]["window_start_ms"], extra, _columns(extra)))
        stage_plain.add(_batch(ws[0]["window_start_ms"], copy.deepcopy(extra), None))
    assert bool(stage.whole) == (case == "whole")
    saved = stage.to_dict()  # the windows held whole are saved like keyed ones
    assert saved["pending"] == stage_plain.to_dict()["pending"]
    assert bool(stage.whole) == (case == "whole")  # saving them changed nothing
    ctx = JobContext(job_id="J")
    got = stage.release(1 << 62, lambda _: ctx)
    want = stage_plain.release(1 << 62, lambda _: ctx)
    assert [r.findings for _, r in got] == [r.findings for _, r in want]
    assert stage.pending == {} and stage.whole == {}
    assert stage.states["J"].to_dict() == stage_plain.states["J"].to_dict()
