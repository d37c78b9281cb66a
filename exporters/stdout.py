"""``peerwatch export stdout``: the OTLP mapping as JSON lines, for local debugging.

Each GpuWindow becomes one line per metric point, each finding/recommendation/health result/
drain action one event line, and anything else (JobEvents) one raw record line::

    {"type": "metric", "name": "hw.power", "unit": "W", "kind": "gauge", "value": 650.0,
     "time_ms": 1795000060000, "attributes": {"host.name": "gpu00005", ...}}
    {"type": "event", "event_name": "peerwatch.straggler.finding", "severity": "WARN", ...}
    {"type": "record", "schema": "JobEvent", "record": {...}}
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from peerwatch.exporters.base import ExportError
from peerwatch.exporters.otlp import METRICS_BY_NAME, event_for, window_points


def json_lines(schema_name: str, record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON-able lines for one record (pure). Raises ExportError for an unmappable record."""
    try:
        if schema_name == "GpuWindow":
            return [
                {
                    "type": "metric",
                    "name": p.name,
                    "unit": METRICS_BY_NAME[p.name].unit,
                    "kind": p.kind,
                    "value": p.value,
                    "time_ms": int(record["window_end_ms"]),
                    "attributes": dict(p.attributes),
                }
                for p in window_points(record)
            ]
        event = event_for(schema_name, record)
    except (KeyError, TypeError, ValueError) as exc:
        raise ExportError(
            f"{schema_name}: cannot map record ({type(exc).__name__}: {exc})"
        ) from exc
    if event is None:
        return [{"type": "record", "schema": schema_name, "record": dict(record)}]
    return [
        {
            "type": "event",
            "event_name": event.event_name,
            "time_ms": event.timestamp_ms,
            "severity": event.severity_text,
            "attributes": dict(event.attributes),
            "body": event.body,
        }
    ]


class StdoutSink:
    """A :class:`~peerwatch.exporters.base.Sink` writing :func:`json_lines` to ``stream``."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self._stream = stream if stream is not None else sys.stdout
        self.lines_written = 0

    def write(self, schema_name: str, record: Mapping[str, Any]) -> None:
        """Write the record's lines. Raises ExportError for an unmappable record."""
        for line in json_lines(schema_name, record):
            self._stream.write(json.dumps(line, sort_keys=True, default=str) + "\n")
            self.lines_written += 1

    def flush(self, timeout_s: float = 10.0) -> bool:
        self._stream.flush()
        return True

    def close(self) -> None:
        self._stream.flush()
