"""scripts/bench_stage3.py on a small fleet: the live hot stage's window batches through stage
3's handler as Avro and as the older JSON form write the same GpuWindow bytes (what the script's
figures compare)."""

from __future__ import annotations

import importlib.util
import pathlib
from typing import Any

from peerwatch.schemas.codec import AvroCodec
from peerwatch.streams.live.window_batches import is_window_batch

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "bench_stage3.py"


def _script() -> Any:
    spec = importlib.util.spec_from_file_location("bench_stage3", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_both_forms_of_the_same_batches_write_the_same_windows() -> None:
    bench = _script()
    events, batches, node_records = bench.window_batches(4, 60)
    assert node_records == 4 * 60 and events
    assert any(is_window_batch(v) for _, v in batches)
    _, from_avro = bench.handle_all(events, batches)
    _, from_json = bench.handle_all(events, bench.as_json(batches))
    assert from_avro and from_avro == from_json
    windows = [AvroCodec("GpuWindow").decode(v) for v in from_avro]
    assert {w["gated"] for w in windows} - {None}  # scored by the detector
    assert len({(w["node"], w["gpu_index"]) for w in windows}) == 4 * 8
