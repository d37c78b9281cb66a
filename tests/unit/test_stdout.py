"""``peerwatch export stdout``: the OTLP mapping as JSON lines."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from peerwatch.exporters.base import ExportError
from peerwatch.exporters.stdout import StdoutSink, json_lines


def test_window_event_and_raw_record_lines(data_dir: Any) -> None:
    records = json.loads((data_dir / "records" / "realistic_records.json").read_text())
    out = io.StringIO()
    sink = StdoutSink(out)
    sink.write("GpuWindow", records["GpuWindow"])
    sink.write("DrainRecommendation", records["DrainRecommendation"])
    sink.write("JobEvent", records["JobEvent"])
    sink.close()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(lines) == sink.lines_written
    power = next(line for line in lines if line.get("name") == "hw.power")
    assert power == {
        "type": "metric", "name": "hw.power", "unit": "W", "kind": "gauge", "value": 566.2,
        "time_ms": 1732875600000,
        "attributes": {"host.name": "gpu-a017", "hw.id": "GPU-3f1c2a7e-9b0d-4c55-8e21-000000000003",
                       "hw.type": "gpu", "gpu.index": 3, "slurm.job.id": "4242_7",
                       "slurm.user": "alice", "slurm.partition": "h100",
                       "slurm.account": "llm-pretrain"},
    }  # fmt: skip
    event = next(line for line in lines if line["type"] == "event")
    assert event["event_name"] == "peerwatch.drain.recommendation"
    assert event["severity"] == "ERROR" and event["body"]["recommendation_id"] == "dr-1a2b"
    assert lines[-1] == {"type": "record", "schema": "JobEvent", "record": records["JobEvent"]}


def test_unmappable_record_raises() -> None:
    with pytest.raises(ExportError):
        json_lines("GpuWindow", {"job_id": "1"})
