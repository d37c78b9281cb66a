"""pytest plugin: a real OpenTelemetry Collector for integration tests.

Register with ``pytest_plugins = ["tests.integration.collector_fixture"]``. The session fixture
``otel_collector`` builds the collector with ``scripts/build-collector.sh`` when its binary is not
cached yet (a cold build takes minutes; later runs reuse the cache under
``$PEERWATCH_CACHE_DIR``), starts it with an OTLP receiver (gRPC and HTTP/protobuf on free
loopback ports) and file exporters writing JSON lines, waits until both ports answer, and stops
it at the end. It never skips: a failed build or start fails the test with the log tail.
``$PEERWATCH_OTELCOL_BIN`` names a prebuilt collector binary instead (skips the build).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-collector.sh"
BUILD_TIMEOUT_S = 1500.0
START_TIMEOUT_S = 30.0

CONFIG_TEMPLATE = """\
receivers:
  otlp:
    protocols:
      grpc: {{endpoint: "127.0.0.1:{grpc_port}"}}
      http: {{endpoint: "127.0.0.1:{http_port}"}}
exporters:
  file/metrics: {{path: "{metrics_path}", flush_interval: 100ms}}
  file/logs: {{path: "{logs_path}", flush_interval: 100ms}}
service:
  telemetry:
    logs: {{level: info}}
    metrics: {{level: none}}
  pipelines:
    metrics: {{receivers: [otlp], exporters: [file/metrics]}}
    logs: {{receivers: [otlp], exporters: [file/logs]}}
"""


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def any_value(value: Mapping[str, Any]) -> Any:
    """An OTLP/JSON AnyValue as a plain Python value (int64 arrives as a string in OTLP/JSON)."""
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        return [any_value(v) for v in value["arrayValue"].get("values", [])]
    if "kvlistValue" in value:
        return attributes(value["kvlistValue"].get("values", []))
    if "bytesValue" in value:
        return value["bytesValue"]
    return None  # an empty AnyValue


def attributes(kvs: list[Mapping[str, Any]]) -> dict[str, Any]:
    """An OTLP/JSON KeyValue list as a dict."""
    return {kv["key"]: any_value(kv.get("value", {})) for kv in kvs}


def _read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        # The exporter may be mid-write on the last line; it is complete on the next read.
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


@dataclass
class OtelCollector:
    """The running collector: endpoints, the file exporter outputs and parsing helpers."""

    grpc_endpoint: str
    http_endpoint: str
    metrics_path: Path
    logs_path: Path
    log_path: Path
    process: subprocess.Popen[bytes] = field(repr=False)

    def read_metrics(self) -> list[dict[str, Any]]:
        """Every data point written so far, flattened: ``name``, ``unit``, ``type`` (gauge/sum),
        ``value``, ``attributes``, ``resource`` (attributes), ``scope``, ``time_unix_nano``, and for
        sums ``monotonic`` and ``temporality``."""
        points = []
        for request in _read_lines(self.metrics_path):
            for rm in request.get("resourceMetrics", []):
                resource = attributes(rm.get("resource", {}).get("attributes", []))
                for sm in rm.get("scopeMetrics", []):
                    scope = sm.get("scope", {}).get("name", "")
                    for metric in sm.get("metrics", []):
                        for kind in ("gauge", "sum"):
                            if kind not in metric:
                                continue
                            data = metric[kind]
                            for dp in data.get("dataPoints", []):
                                value = (
                                    dp["asDouble"] if "asDouble" in dp else int(dp.get("asInt", 0))
                                )
                                point = {
                                    "name": metric["name"], "unit": metric.get("unit", ""),
                                    "type": kind, "value": value,
                                    "attributes": attributes(dp.get("attributes", [])),
                                    "resource": resource, "scope": scope,
                                    "time_unix_nano": int(dp.get("timeUnixNano", 0)),
                                }  # fmt: skip
                                if kind == "sum":
                                    point["monotonic"] = bool(data.get("isMonotonic", False))
                                    point["temporality"] = data.get("aggregationTemporality")
                                points.append(point)
        return points

    def read_logs(self) -> list[dict[str, Any]]:
        """Every log record written so far: ``event_name``, ``severity_number``,
        ``severity_text``, ``body`` (plain value), ``attributes``, ``resource``, ``time_unix_nano``."""
        records = []
        for request in _read_lines(self.logs_path):
            for rl in request.get("resourceLogs", []):
                resource = attributes(rl.get("resource", {}).get("attributes", []))
                for sl in rl.get("scopeLogs", []):
                    for lr in sl.get("logRecords", []):
                        records.append({
                            "event_name": lr.get("eventName", ""),
                            "severity_number": lr.get("severityNumber"),
                            "severity_text": lr.get("severityText", ""),
                            "body": any_value(lr.get("body", {})),
                            "attributes": attributes(lr.get("attributes", [])),
                            "resource": resource,
                            "time_unix_nano": int(lr.get("timeUnixNano", 0)),
                        })  # fmt: skip
        return records

    def wait_for(
        self,
        read: Callable[[], list[dict[str, Any]]],
        predicate: Callable[[list[dict[str, Any]]], bool],
        timeout_s: float = 30.0,
    ) -> list[dict[str, Any]]:
        """Poll ``read`` until ``predicate`` holds on its result; return it. Fails on timeout."""
        deadline = time.monotonic() + timeout_s
        items = read()
        while not predicate(items):
            if time.monotonic() > deadline:
                pytest.fail(
                    f"collector output did not match within {timeout_s}s; {len(items)} items; "
                    f"collector log:\n{_tail(self.log_path.read_text(errors='replace'))}"
                )
            if self.process.poll() is not None:
                pytest.fail(f"collector exited {self.process.returncode}:\n"
                            f"{_tail(self.log_path.read_text(errors='replace'))}")  # fmt: skip
            time.sleep(0.2)
            items = read()
        return items


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def collector_binary() -> Path:
    """Build the collector if needed (see scripts/build-collector.sh); fail with the build log."""
    if os.environ.get("PEERWATCH_OTELCOL_BIN"):
        return Path(os.environ["PEERWATCH_OTELCOL_BIN"])
    try:
        proc = subprocess.run(
            ["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as exc:
        out = (
            (exc.stderr or b"").decode(errors="replace")
            if isinstance(exc.stderr, bytes)
            else (exc.stderr or "")
        )
        pytest.fail(f"collector build took over {BUILD_TIMEOUT_S}s:\n{_tail(out)}")
    if proc.returncode != 0:
        pytest.fail(
            f"collector build failed ({proc.returncode}):\n{_tail(proc.stderr + proc.stdout)}"
        )
    binary = Path(proc.stdout.strip().splitlines()[-1])
    if not binary.is_file():
        pytest.fail(f"collector build printed {binary}, which does not exist")
    return binary


def _start(binary: Path, workdir: Path) -> OtelCollector:
    grpc_port, http_port = _free_port(), _free_port()
    config = workdir / "config.yaml"
    collector_log = workdir / "collector.log"
    metrics_path, logs_path = workdir / "metrics.jsonl", workdir / "logs.jsonl"
    config.write_text(CONFIG_TEMPLATE.format(
        grpc_port=grpc_port, http_port=http_port, metrics_path=metrics_path, logs_path=logs_path,
    ))  # fmt: skip
    with collector_log.open("wb") as log_file:
        process = subprocess.Popen(
            [str(binary), "--config", f"file:{config}"], stdout=log_file, stderr=subprocess.STDOUT
        )
    collector = OtelCollector(
        grpc_endpoint=f"http://127.0.0.1:{grpc_port}",
        http_endpoint=f"http://127.0.0.1:{http_port}",
        metrics_path=metrics_path, logs_path=logs_path, log_path=collector_log, process=process,
    )  # fmt: skip
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            break
        if _answers(grpc_port) and _answers(http_port):
            return collector
        time.sleep(0.1)
    _stop(collector)
    raise RuntimeError(
        f"collector did not open 127.0.0.1:{grpc_port} and :{http_port} "
        f"(exit {process.returncode}):\n{_tail(collector_log.read_text(errors='replace'))}"
    )


def _stop(collector: OtelCollector) -> None:
    if collector.process.poll() is None:
        collector.process.terminate()
        try:
            collector.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            collector.process.kill()
            collector.process.wait(timeout=10)


@pytest.fixture(scope="session")
def otel_collector() -> Iterator[OtelCollector]:
    """A running collector (OTLP gRPC + HTTP on loopback -> JSON-lines files)."""
    binary = collector_binary()
    workdir = Path(tempfile.mkdtemp(prefix="peerwatch-otelcol-"))
    errors = []
    # A free port can be taken between probing and binding: try again on new ports.
    for _attempt in range(3):
        try:
            collector = _start(binary, workdir)
            break
        except RuntimeError as exc:
            errors.append(str(exc))
    else:
        pytest.fail("collector did not start:\n" + "\n---\n".join(errors))
    try:
        yield collector
    finally:
        _stop(collector)
