"""The stage 2 -> 3 WindowBatch message (streams/live/window_batches.py), alone and through
stage 3's handler: each job's windows travel as the aggregator's columns and stage 3 makes the
same windows from them as replay does; a scored window's bytes are the whole encoding of the
scored record, restarts included; hostile batches are refused with a record error."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from closedgen import closed_of, closed_windows
from test_column_encoder import odd
from test_stream_handlers import jobs_handler

from peerwatch.errors import CodecError
from peerwatch.schemas.codec import AvroCodec
from peerwatch.streams.core.window_dicts import WindowDicts
from peerwatch.streams.core.windows import merge_closed
from peerwatch.streams.live.handlers import RECORD_ERRORS
from peerwatch.streams.live.window_batches import (
    MAX_BATCH_BYTES,
    WindowBatchCodec,
    is_window_batch,
    job_parts,
)

CODEC = WindowBatchCodec()
GPU_WINDOW = AvroCodec("GpuWindow")


def part(job: str, gpus: list[tuple[str, int]], wms: int, **kw: Any) -> dict[str, Any]:
    return job_parts(closed_of(job, gpus, wms, **kw))[job]


def gpus(node: str, n: int, first: int = 0) -> list[tuple[str, int]]:
    return [(node, first + i) for i in range(n)]


def test_a_batch_round_trips_as_the_windows_of_its_sources_sorted_by_gpu() -> None:
    cs = {4: closed_of("7", gpus("n4", 3), 30_000), 1: closed_of("7", gpus("n1", 2), 30_000)}
    value = CODEC.encode_batch("7", 0, 30_000, {s: job_parts(c)["7"] for s, c in cs.items()}, 12.5)
    assert is_window_batch(value) and not is_window_batch(b'{"kind": "windows"}')
    message = CODEC.decode_batch(value)
    assert (message["kind"], message["job_id"], message["closed_wall_ms"]) == ("windows", "7", 12.5)
    assert message["sources"] == [1, 4] and message["parts"] == {}
    batch = message["batch"].batch()  # the windows, made as when released
    want = sorted(WindowDicts(merge_closed([cs[1], cs[4]])).every(),
                  key=lambda w: (w["node"], w["gpu_index"]))  # fmt: skip
    assert list(batch.windows) == want
    assert batch.columns.keys == [f"{w['node']}/{w['gpu_index']}" for w in want]


def test_stage_3_makes_the_windows_replay_makes_from_the_same_columns() -> None:
    """Every job window of a simulated fleet (and one with values at the edges of their types):
    the windows and detector columns stage 3 makes from the message are replay's."""
    parts = closed_windows()
    edges = odd(next(p for p in parts if len(p.node) >= 4))
    for closed in [*parts, edges]:
        replay = {job: (list(ws), cols) for job, ws, cols in closed.by_job()}
        for job, columns in job_parts(closed).items():
            got = CODEC.decode_batch(CODEC.encode_batch(job, closed.start_ms, closed.end_ms,
                                                        {0: columns}, None))["batch"].batch()  # fmt: skip
            windows, cols = replay[job]
            # as bytes: the odd window's NaN is not equal to itself
            assert [GPU_WINDOW.encode(w) for w in got.windows] == [
                GPU_WINDOW.encode(w) for w in windows
            ]
            assert got.columns.keys == cols.keys
            assert (got.columns.reports == cols.reports).all()
            assert (got.columns.fires == cols.fires).all()
            for name in ("clk_ratio", "sm_frac", "throttle_frac", "power_ratio"):
                np.testing.assert_array_equal(got.columns.column(name).values,
                                              cols.column(name).values)  # fmt: skip
    assert any(closed.xids for closed in parts)


def _batch(parts: list[dict[str, Any]], job: str = "7", start: int = 0) -> bytes:
    return CODEC.batches.encode(
        {"job_id": job, "window_start_ms": start, "window_end_ms": start + 30_000, "parts": parts}
    )


def _columns(**change: Any) -> list[dict[str, Any]]:
    good = part("7", gpus("a", 2), 30_000)
    return [{"source": 0, "windows": [], "columns": {**good, **change}}]


@pytest.mark.parametrize(
    "value",
    [
        _batch([]),
        _batch([{"source": 0, "windows": []}]),
        _batch([{"source": 0, "windows": [b"\xc3\x01" + b"\x00" * 8]}]),
        _batch(_columns(rows=3)),
        _batch(_columns(rows=0, node=b"", gpu_index=b"", uuid=b"", ints=b"", floats=b"")),
        _batch(_columns(rows=-1)),
        _batch(_columns(node=np.array([0, 9], "<i4").tobytes())),
        _batch(_columns(uuid=np.array([-2, 1], "<i4").tobytes())),
        _batch(_columns(gpu_index=np.array([0, -1], "<i4").tobytes())),
        _batch(_columns(ints=b"\x00" * 7)),
        _batch(_columns(floats=b"")),
        _batch(_columns(int_names=["n"])),
        _batch(_columns(float_names=["clk_s", "clk_s", "sm_s", "pw_s", "pr_s"])),
        _batch(_columns(xids=[{"row": 2, "xids": [79]}])),
        _batch(_columns(names=[])),
        _batch(_columns())[:-2],
        b"\xc3\x01" + AvroCodec("WindowBatch").fingerprint + b"\xff" * 40,
        b"\xc3\x01",
    ],
)  # fmt: skip
def test_a_hostile_binary_batch_is_refused_with_a_record_error(value: bytes) -> None:
    handler, _, pending = jobs_handler()
    with pytest.raises(RECORD_ERRORS):
        handler.handle("b", 0, b"7", value)
    assert pending == {} and handler.held == {}


def _released(handler: Any, wms: int) -> list[bytes]:
    beat = json.dumps({"kind": "watermark", "marks": {"0": wms, "1": wms, "2": wms}}).encode()
    out = handler.handle("b", 0, b"~watermark", beat)
    assert out and all(o.topic == "windows" for o in out)
    return [o.value for o in out]


def _check_whole(values: list[bytes]) -> list[dict[str, Any]]:
    decoded = [GPU_WINDOW.decode(v) for v in values]
    assert values == [GPU_WINDOW.encode(w) for w in decoded]
    return decoded


def test_stage_3_writes_scored_windows_equal_to_their_whole_encoding() -> None:
    handler, _, pending = jobs_handler()
    wms = handler.stage3.stage.settings.window_ms
    parts = {0: part("7", gpus("a", 2), wms), 1: part("7", gpus("b", 2), wms)}
    assert handler.handle("b", 0, b"7", CODEC.encode_batch("7", 0, wms, parts, 1.0)) == []
    assert len(pending) == 1
    got = _check_whole(_released(handler, wms))
    assert [(w["node"], w["gpu_index"]) for w in got] == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert all(w["gated"] == "warmup" for w in got)  # scored by the detector (first window)
    assert pending == {}


def test_a_restarted_stage_3_writes_the_same_bytes_from_its_pending_table() -> None:
    first, job_table, pending = jobs_handler()
    wms = first.stage3.stage.settings.window_ms
    value = CODEC.encode_batch("7", 0, wms, {0: part("7", gpus("a", 3), wms)}, None)
    first.handle("b", 0, b"7", value)
    again, _, _ = jobs_handler()
    again.job_table, again.pending_table = job_table, dict(pending)
    again.restore("7")
    assert _released(again, wms) == _released(first, wms)


def test_older_json_windows_replace_the_columns_windows_of_their_gpus() -> None:
    handler, _, _ = jobs_handler()
    wms = handler.stage3.stage.settings.window_ms
    handler.handle("b", 0, b"7", CODEC.encode_batch("7", 0, wms, {0: part("7", gpus("a", 2), wms)},
                                                    None))  # fmt: skip
    [older] = closed_of("7", [("a", 1)], wms, clk=0.5).by_job()[0][1]
    msg = {"kind": "windows", "src": 1, "job_id": "7", "window_start_ms": 0,
           "window_end_ms": wms, "windows": [older]}  # fmt: skip
    handler.handle("b", 0, b"7", json.dumps(msg).encode())
    got = _check_whole(_released(handler, wms))
    assert [w["clk_ratio"] for w in got] == [0.9, 0.5]


def test_a_damaged_binary_pending_entry_is_dropped_and_counted() -> None:
    handler, job_table, pending = jobs_handler()
    wms = handler.stage3.stage.settings.window_ms
    handler.handle("b", 0, b"7", CODEC.encode_batch("7", 0, wms, {0: part("7", gpus("a", 1), wms)},
                                                    None))  # fmt: skip
    [key] = pending
    pending[key] = pending[key][:-5]
    again, _, _ = jobs_handler()
    again.job_table, again.pending_table = job_table, pending
    again.restore("7")
    assert again.counters.pending_damaged == 1 and pending == {}


def test_decode_refuses_a_batch_that_is_not_one() -> None:
    with pytest.raises(CodecError):
        CODEC.decode_batch(AvroCodec("StepTime").encode(
            {"job_id": "7", "node": "n", "rank": 0, "step": 1, "ts_ms": 1,
             "step_duration_ms": 5.0}))  # fmt: skip


def _big_job(sources: int, gpus_per_source: int, wms: int) -> dict[int, dict[str, Any]]:
    return {src: part("big", gpus(f"n{src:02d}", gpus_per_source), wms) for src in range(sources)}


def test_a_big_jobs_window_goes_in_messages_of_whole_sources_under_the_limit() -> None:
    parts = _big_job(12, 1366, 5_000)  # a 16,392-GPU job over 12 samples partitions
    values = CODEC.encode_batches("big", 0, 5_000, parts, 7.0)
    assert len(values) > 1 and all(len(v) <= MAX_BATCH_BYTES + 64 for v in values)
    seen: list[int] = []
    for value in values:
        message = CODEC.decode_batch(value)
        seen += message["sources"]
        nodes = {w["node"] for w in message["batch"].batch().windows}
        assert nodes == {f"n{s:02d}" for s in message["sources"]}
    assert seen == list(range(12))  # every source once, in order, never split
    [whole] = CODEC.encode_batches("big", 0, 5_000, parts, 7.0, max_bytes=1 << 40)
    assert whole == CODEC.encode_batch("big", 0, 5_000, parts, 7.0)


def test_stage_3_takes_a_window_in_several_messages_and_restores_them_all() -> None:
    first, job_table, pending = jobs_handler()
    wms = first.stage3.stage.settings.window_ms
    parts = _big_job(3, 4, wms)
    values = CODEC.encode_batches("big", 0, wms, parts, None, max_bytes=600)
    assert len(values) == 3
    for value in values:
        assert first.handle("b", 0, b"big", value) == []
    assert len(pending) == 3  # one entry per message, under its source
    assert len(first.stage3.stage.whole[("big", 0)]) == 3  # held as columns, side by side
    again, _, _ = jobs_handler()
    again.job_table, again.pending_table = job_table, dict(pending)
    again.restore("big")
    one, _, _ = jobs_handler()
    one.handle("b", 0, b"big", CODEC.encode_batch("big", 0, wms, parts, None))
    outs = [[o.value for o in h.handle("b", 0, b"~watermark", json.dumps(
        {"kind": "watermark", "marks": {str(s): wms for s in range(3)}}).encode())]
        for h in (first, again, one)]  # fmt: skip
    assert outs[0] == outs[1] == outs[2]
    assert len(_check_whole(outs[0])) == 12


def test_a_closed_window_start_cut_in_parts_and_merged_again_gives_the_same_windows() -> None:
    """What stage 3 does with several sources' batches of a window (cut, sent, merged): the
    windows and columns are those of the window start merged in one aggregator."""
    rng = np.random.default_rng(3)
    for closed in closed_windows():
        n = len(closed.node)
        order = rng.permutation(n)
        cut = n // 3
        merged = merge_closed([closed.subset(order[:cut]), closed.subset(order[cut:])])
        assert merged.xids.keys() == {int(np.flatnonzero(order == s)[0]) for s in closed.xids}
        want = {job: ([GPU_WINDOW.encode(w) for w in ws], cols.keys)
                for job, ws, cols in closed.by_job()}  # fmt: skip
        got = {job: ([GPU_WINDOW.encode(w) for w in ws], cols.keys)
               for job, ws, cols in merged.by_job()}  # fmt: skip
        assert got == want


def test_after_a_rebalance_a_windows_batches_are_held_as_columns_again() -> None:
    handler, _, _ = jobs_handler()
    wms = handler.stage3.stage.settings.window_ms
    values = CODEC.encode_batches("big", 0, wms, _big_job(2, 4, wms), None, max_bytes=600)
    for offset, value in enumerate(values):  # held in memory, their offsets not committed
        handler.handle("b", 0, b"big", value, offset=offset)
    assert len(handler.stage3.stage._whole_keys) == 1
    handler.forget()  # partitions revoked: memory forgotten, the batches read again
    assert handler.stage3.stage._whole_keys == {}
    for offset, value in enumerate(values):
        handler.handle("b", 0, b"big", value, offset=offset)
    assert len(handler.stage3.stage.whole[("big", 0)]) == 2  # not keyed as dicts
