"""The stage 2 -> 3 WindowBatch message and the scored GpuWindows written from it
(streams/live/window_batches.py), alone and through stage 3's handler: a scored window's bytes
are exactly the whole encoding of the scored record, restarts included; hostile batches are
refused with a record error."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from test_stream_handlers import jobs_handler
from windowgen import window

from peerwatch.errors import CodecError
from peerwatch.producers.sim import Fleet
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.schemas.codec import AvroCodec
from peerwatch.settings import Settings
from peerwatch.streams.core.pipeline import WINDOW, run_records
from peerwatch.streams.live.handlers import RECORD_ERRORS
from peerwatch.streams.live.window_batches import (
    MAX_BATCH_BYTES,
    STAGE3_FIELDS,
    WindowBatchCodec,
    is_window_batch,
)

CODEC = WindowBatchCodec()
GPU_WINDOW = AvroCodec("GpuWindow")
SCENARIO: dict[str, Any] = {
    "fleet": {"nodes": 2, "gpus_per_node": 8, "interval_s": 1, "duration_s": 120, "seed": 5,
              "step_times": True},
    "jobs": [{"job_id": "a", "gpus": 16, "first_node": 0, "warmup_s": 0}],
    "faults": [
        {"name": "sm_clock_drop", "node": 0, "gpu_index": 1, "start_s": 30, "params": {"pct": 10}},
        {"name": "xid", "node": 1, "gpu_index": 0, "start_s": 60, "params": {"xid": 79}},
    ],
}  # fmt: skip


def unscored(w: dict[str, Any]) -> dict[str, Any]:
    return {**w, **dict.fromkeys(STAGE3_FIELDS)}


@pytest.fixture(scope="module")
def pipeline_windows() -> list[dict[str, Any]]:
    """Scored GpuWindows of the pipeline over a simulated fleet (every field the aggregator
    fills, with real values)."""
    records = [(r.stream, r.key, r.value) for t in Fleet(parse_scenario(SCENARIO)).ticks()
               for r in t]  # fmt: skip
    out = [o.value for o in run_records(records, Settings()) if o.kind == WINDOW]
    assert len(out) > 100
    return out


def test_the_tail_starts_at_the_first_field_stage_3_sets() -> None:
    assert CODEC.tail_fields[: len(STAGE3_FIELDS)] == STAGE3_FIELDS
    assert set(CODEC.tail_fields) >= {"fleet_clk_ratio", "thermal_frac"}


def test_a_batch_round_trips_by_source_in_order() -> None:
    ws = {src: [window("7", i, 0, node=f"n{src}") for i in range(3)] for src in (4, 1)}
    value = CODEC.encode_batch("7", 0, 30_000, ws, 12.5)
    assert is_window_batch(value) and not is_window_batch(b'{"kind": "windows"}')
    message, heads = CODEC.decode_batch(value)
    assert (message["kind"], message["job_id"], message["closed_wall_ms"]) == ("windows", "7", 12.5)
    assert list(message["parts"]) == [1, 4]
    for src, got in message["parts"].items():
        assert got == [GPU_WINDOW.decode(GPU_WINDOW.encode(w)) for w in ws[src]]
        assert [gpu for gpu, _ in heads[src]] == [(w["node"], w["gpu_index"]) for w in ws[src]]
        assert all(head is not None for _, head in heads[src])


@pytest.mark.parametrize(
    ("score", "gated", "step_ms"),
    [(None, None, None), (2.75, None, 31.5), (None, "warmup", None), (-0.0, "jöb_wïde", 1e300),
     (math.inf, "low_activity", math.nan)],
)  # fmt: skip
def test_head_and_tail_are_the_whole_encoding_of_every_pipeline_window(
    pipeline_windows: list[dict[str, Any]], score: Any, gated: Any, step_ms: Any
) -> None:
    for w in pipeline_windows:
        value = CODEC.encode_batch(w["job_id"], w["window_start_ms"], w["window_end_ms"],
                                   {0: [unscored(w)]}, None)  # fmt: skip
        message, heads = CODEC.decode_batch(value)
        [(_, head)] = heads[0]
        assert head is not None
        scored = {**message["parts"][0][0], "score": score, "gated": gated, "step_ms": step_ms}
        assert CODEC.scored(head, scored) == GPU_WINDOW.encode(scored)
    kinds = {(w["fleet_clk_ratio"] is None, w["thermal_frac"] is None) for w in pipeline_windows}
    assert (True, False) in kinds  # the tail holds real values, not only nulls


def test_a_window_of_an_older_schema_version_is_encoded_whole() -> None:
    import io

    from fastavro import schemaless_writer

    from peerwatch.schemas import registry
    from peerwatch.schemas.codec import MAGIC

    [(_, v1)] = registry.released_schemas("GpuWindow")
    buf = io.BytesIO(MAGIC + registry.fingerprint(v1))
    buf.seek(0, io.SEEK_END)
    schemaless_writer(buf, v1, unscored(window("7", 0, 0)))
    value = CODEC.batches.encode({"job_id": "7", "window_start_ms": 0, "window_end_ms": 30_000,
                                  "parts": [{"source": 0, "windows": [buf.getvalue()]}]})  # fmt: skip
    decoded, heads = CODEC.decode_batch(value)
    assert heads[0][0][1] is None
    w = decoded["parts"][0][0]
    assert w["thermal_frac"] is None and w["clk_ratio"] == 0.9  # resolved into the current form
    scored = {**w, "score": 1.0}
    assert CODEC.scored(None, scored) == GPU_WINDOW.encode(scored)


def _batch(parts: list[dict[str, Any]], job: str = "7", start: int = 0) -> bytes:
    return CODEC.batches.encode(
        {"job_id": job, "window_start_ms": start, "window_end_ms": start + 30_000, "parts": parts}
    )


@pytest.mark.parametrize(
    "value",
    [
        _batch([]),
        _batch([{"source": 0, "windows": []}]),
        _batch([{"source": 0, "windows": [GPU_WINDOW.encode(window("8", 0, 0))]}]),
        _batch([{"source": 0, "windows": [GPU_WINDOW.encode(window("7", 0, 1))]}]),
        _batch([{"source": 0, "windows": [GPU_WINDOW.encode(window("7", 0, 0))[:-3]]}]),
        _batch([{"source": 0, "windows": [AvroCodec("StepTime").encode(
            {"job_id": "7", "node": "n", "rank": 0, "step": 1, "ts_ms": 1,
             "step_duration_ms": 5.0})]}]),
        _batch([{"source": 0, "windows": [b"\xc3\x01" + b"\x00" * 8]}]),
        _batch([{"source": 0, "windows": [GPU_WINDOW.encode(window("7", 0, 0))]}])[:-2],
        b"\xc3\x01" + AvroCodec("WindowBatch").fingerprint + b"\xff" * 40,
        b"\xc3\x01",
    ],
)  # fmt: skip
def test_a_hostile_binary_batch_is_refused_with_a_record_error(value: bytes) -> None:
    handler, _, pending = jobs_handler()
    with pytest.raises(RECORD_ERRORS):
        handler.handle("b", 0, b"7", value)
    assert pending == {} and handler.heads == {}


def _released(handler: Any, wms: int) -> list[bytes]:
    beat = json.dumps({"kind": "watermark", "marks": {"0": wms, "1": wms}}).encode()
    out = handler.handle("b", 0, b"~watermark", beat)
    assert out and all(o.topic == "windows" for o in out)
    assert handler.heads == {}
    return [o.value for o in out]


def _check_whole(values: list[bytes]) -> list[dict[str, Any]]:
    decoded = [GPU_WINDOW.decode(v) for v in values]
    assert values == [GPU_WINDOW.encode(w) for w in decoded]
    return decoded


def test_stage_3_writes_scored_windows_equal_to_their_whole_encoding() -> None:
    handler, _, pending = jobs_handler()
    wms = handler.stage3.stage.settings.window_ms
    parts = {src: [window("7", i, 0, node=node, window_end_ms=wms) for i in range(2)]
             for src, node in ((0, "a"), (1, "b"))}  # fmt: skip
    assert handler.handle("b", 0, b"7", CODEC.encode_batch("7", 0, wms, parts, 1.0)) == []
    assert len(pending) == 1 and len(handler.heads[("7", 0)]) == 4
    got = _check_whole(_released(handler, wms))
    assert sorted((w["node"], w["gpu_index"]) for w in got) == [("a", 0), ("a", 1), ("b", 0),
                                                                 ("b", 1)]  # fmt: skip
    assert all(w["gated"] == "warmup" for w in got)  # scored by the detector (first window)
    assert pending == {}


def test_a_restarted_stage_3_writes_the_same_bytes_from_its_pending_table() -> None:
    first, job_table, pending = jobs_handler()
    wms = first.stage3.stage.settings.window_ms
    parts = {0: [window("7", i, 0, node="a", window_end_ms=wms) for i in range(3)]}
    value = CODEC.encode_batch("7", 0, wms, parts, None)
    first.handle("b", 0, b"7", value)
    again, _, _ = jobs_handler()
    again.job_table, again.pending_table = job_table, dict(pending)
    again.restore("7")
    assert len(again.heads[("7", 0)]) == 3
    assert _released(again, wms) == _released(first, wms)


def test_older_json_windows_replace_the_heads_of_their_gpus() -> None:
    handler, _, _ = jobs_handler()
    wms = handler.stage3.stage.settings.window_ms
    binary = {0: [window("7", i, 0, node="a", window_end_ms=wms) for i in range(2)]}
    handler.handle("b", 0, b"7", CODEC.encode_batch("7", 0, wms, binary, None))
    newer = window("7", 1, 0, node="a", window_end_ms=wms, clk_ratio=0.5)
    msg = {"kind": "windows", "src": 1, "job_id": "7", "window_start_ms": 0,
           "window_end_ms": wms, "windows": [newer]}  # fmt: skip
    handler.handle("b", 0, b"7", json.dumps(msg).encode())
    assert list(handler.heads[("7", 0)]) == [("a", 0)]
    got = _check_whole(_released(handler, wms))
    assert [w["clk_ratio"] for w in got] == [0.9, 0.5]


def test_a_damaged_binary_pending_entry_is_dropped_and_counted() -> None:
    handler, job_table, pending = jobs_handler()
    wms = handler.stage3.stage.settings.window_ms
    value = CODEC.encode_batch("7", 0, wms, {0: [window("7", 0, 0, window_end_ms=wms)]}, None)
    handler.handle("b", 0, b"7", value)
    [key] = pending
    pending[key] = pending[key][:-5]
    again, _, _ = jobs_handler()
    again.job_table, again.pending_table = job_table, pending
    again.restore("7")
    assert again.counters.pending_damaged == 1 and pending == {} and again.heads == {}


def test_decode_refuses_a_batch_that_is_not_one() -> None:
    with pytest.raises(CodecError):
        CODEC.decode_batch(GPU_WINDOW.encode(window("7", 0, 0)))


def _big_job(sources: int, gpus_per_source: int, wms: int) -> dict[int, list[dict[str, Any]]]:
    return {
        src: [window("big", src * gpus_per_source + i, 0, window_end_ms=wms)
              for i in range(gpus_per_source)]
        for src in range(sources)
    }  # fmt: skip


def test_a_big_jobs_window_goes_in_messages_of_whole_sources_under_the_limit() -> None:
    parts = _big_job(12, 1366, 5_000)  # a 16,392-GPU job over 12 samples partitions
    values = CODEC.encode_batches("big", 0, 5_000, parts, 7.0)
    assert len(values) > 1 and all(len(v) <= MAX_BATCH_BYTES + 64 for v in values)
    seen: list[int] = []
    for value in values:
        message, _ = CODEC.decode_batch(value)
        seen += list(message["parts"])
        for src, got in message["parts"].items():
            assert [(w["node"], w["gpu_index"]) for w in got] == [
                (w["node"], w["gpu_index"]) for w in parts[src]
            ]
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
    again, _, _ = jobs_handler()
    again.job_table, again.pending_table = job_table, dict(pending)
    again.restore("big")
    assert len(again.stage3.stage.pending["big"][0]) == 12
    beat = json.dumps({"kind": "watermark", "marks": {str(s): wms for s in range(3)}}).encode()
    outs = [h.handle("b", 0, b"~watermark", beat) for h in (first, again)]
    assert [o.value for o in outs[0]] == [o.value for o in outs[1]]
    assert len(_check_whole([o.value for o in outs[0]])) == 12
