"""The OTLP mapping (pure) and its SDK wiring, read back through the SDK's InMemoryMetricReader."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

import pytest
from fakes import FakeClock
from opentelemetry._logs import SeverityNumber
from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter
from opentelemetry.sdk.metrics.export import Gauge, InMemoryMetricReader, Sum

from peerwatch.errors import ConfigError
from peerwatch.exporters.base import ExportError
from peerwatch.exporters.otlp import METRICS, event_for, gpu_attributes, window_points
from peerwatch.exporters.otlp_sdk import OtlpSink, signal_url
from peerwatch.settings import ExportSettings

T0_MS = 1_795_000_000_000
WINDOW_MS = 60_000


def load_records(data_dir: Any) -> dict[str, dict[str, Any]]:
    records: dict[str, dict[str, Any]] = json.loads(
        (data_dir / "records" / "realistic_records.json").read_text()
    )
    return records


@pytest.fixture
def records(data_dir: Any) -> dict[str, dict[str, Any]]:
    return load_records(data_dir)


def window(
    base: dict[str, Any], job: str, node: str, gpu: int, n: int = 0, **fields: Any
) -> dict[str, Any]:
    """A GpuWindow like the realistic one, for ``job``/``node``/``gpu``, the n-th window."""
    return {
        **base, "job_id": job, "node": node, "gpu_index": gpu,
        "gpu_uuid": f"GPU-{node}-{gpu:04d}", "window_start_ms": T0_MS + n * WINDOW_MS,
        "window_end_ms": T0_MS + (n + 1) * WINDOW_MS, **fields,
    }  # fmt: skip


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000_000)  # monotonic_s() == 1000.0


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture
def log_exporter() -> InMemoryLogRecordExporter:
    return InMemoryLogRecordExporter()  # type: ignore[no-untyped-call]


@pytest.fixture
def sink(
    reader: InMemoryMetricReader, log_exporter: InMemoryLogRecordExporter, clock: FakeClock
) -> Iterator[OtlpSink]:
    config = ExportSettings(max_series=5, stale_after_s=600.0, event_delay_s=0.05)
    s = OtlpSink(config, metric_exporter=None, log_exporter=log_exporter,
                 metric_readers=[reader], clock=clock)  # fmt: skip
    yield s
    s.close()


def collected(reader: InMemoryMetricReader) -> dict[str, Any]:
    """name -> metric of the one collection (``get_metrics_data`` collects now)."""
    data = reader.get_metrics_data()
    assert data is not None
    return {
        m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }


def points(metric: Any) -> dict[tuple[Any, ...], float]:
    """(job, node, gpu[, error.type]) -> value."""
    out = {}
    for p in metric.data.data_points:
        a = p.attributes
        key = (a["slurm.job.id"], a["host.name"], a["gpu.index"])
        out[key + ((a["error.type"],) if "error.type" in a else ())] = p.value
    return out


# --- pure mapping -------------------------------------------------------------------------------


def test_window_points_names_values_and_units(records: dict[str, Any]) -> None:
    w = records["GpuWindow"]
    got = {(p.name, p.attributes.get("error.type")): p for p in window_points(w)}
    assert got[("hw.power", None)].value == 566.2
    assert got[("hw.gpu.utilization", None)].value == 0.86
    assert got[("hw.temperature", None)].value == 84
    assert got[("peerwatch.gpu.sm_clock.ratio", None)].value == 0.93
    assert got[("peerwatch.gpu.throttle.ratio", None)].value == 0.25
    assert got[("peerwatch.gpu.power_cap.ratio", None)].value == 0.0
    assert got[("peerwatch.gpu.power_limit.ratio", None)].value == 0.81
    assert got[("peerwatch.straggler.score", None)].value == 4.7
    assert math.isclose(got[("peerwatch.training.step.duration", None)].value, 1.501)
    assert got[("hw.energy", None)].kind == "counter" and got[("hw.energy", None)].value == 33972.0
    assert (
        got[("hw.errors", "nvlink")].value == 2 and got[("hw.errors", "nvlink")].kind == "counter"
    )
    assert got[("hw.errors", "ecc_uncorrected")].value == 0
    assert {m.name for m in METRICS} == {name for name, _ in got}
    units = {m.name: m.unit for m in METRICS}
    assert (
        units["hw.power"] == "W" and units["hw.temperature"] == "Cel" and units["hw.energy"] == "J"
    )


def test_gpu_attributes_carry_identity_and_slurm_fields(records: dict[str, Any]) -> None:
    assert gpu_attributes(records["GpuWindow"]) == {
        "host.name": "gpu-a017", "hw.id": "GPU-3f1c2a7e-9b0d-4c55-8e21-000000000003",
        "hw.type": "gpu", "gpu.index": 3, "slurm.job.id": "4242_7", "slurm.user": "alice",
        "slurm.partition": "h100", "slurm.account": "llm-pretrain",
    }  # fmt: skip
    bare = {
        **records["GpuWindow"],
        "gpu_uuid": None,
        "user": None,
        "partition": None,
        "account": None,
    }
    attrs = gpu_attributes(bare)
    assert attrs["hw.id"] == "gpu-a017/gpu3"
    assert not {"slurm.user", "slurm.partition", "slurm.account"} & attrs.keys()


@pytest.mark.parametrize("value", [None, float("nan"), float("inf")])
def test_null_or_non_finite_fields_make_no_point(records: dict[str, Any], value: Any) -> None:
    w = {**records["GpuWindow"], "power_w": value, "score": value, "gated": "low_activity"}
    names = {p.name for p in window_points(w)}
    assert "hw.power" not in names and "peerwatch.straggler.score" not in names
    assert "hw.gpu.utilization" in names


def test_negative_counter_delta_is_not_an_error_count(records: dict[str, Any]) -> None:
    w = {**records["GpuWindow"], "pcie_replay_delta": -5}
    types = {p.attributes.get("error.type") for p in window_points(w) if p.name == "hw.errors"}
    assert types == {"ecc_uncorrected", "nvlink"}


def test_events_for_each_output_schema(records: dict[str, Any]) -> None:
    finding = event_for("StragglerFinding", records["StragglerFinding"])
    assert finding is not None
    assert finding.event_name == "peerwatch.straggler.finding"
    assert finding.severity_number is SeverityNumber.WARN
    assert finding.timestamp_ms == records["StragglerFinding"]["window_end_ms"]
    assert finding.attributes["slurm.job.id"] == "4242_7" and finding.attributes["gpu.index"] == 3
    assert finding.body["features"][0] == {"feature": "clk", "value": 0.93, "peer_median": 0.998,
                                           "mad": 0.004, "z": -10.96}  # fmt: skip
    rec = event_for("DrainRecommendation", records["DrainRecommendation"])
    assert rec is not None and rec.severity_number is SeverityNumber.ERROR
    assert rec.attributes["peerwatch.recommendation.action"] == "DRAIN"
    assert rec.attributes["gpu.indices"] == [3] and rec.attributes["host.name"] == "gpu-a017"
    health = event_for("HealthCheckResult", records["HealthCheckResult"])
    assert health is not None and health.severity_text == "WARN"
    assert health.attributes["peerwatch.health.failed_checks"] == ["pcie_width"]
    # null fields never reach OTLP (AnyValue has no null)
    assert "gpu_index" not in health.body["checks"][0]
    action = event_for("DrainAction", records["DrainAction"])
    assert action is not None and action.attributes["peerwatch.action.decision"] == "SHADOWED"
    assert "peerwatch.action.refusal" not in action.attributes
    assert event_for("GpuWindow", records["GpuWindow"]) is None


def test_network_events_name_the_port_and_the_switch(records: dict[str, Any]) -> None:
    link = {**records["StragglerFinding"], "gpu_index": None, "status": "HARD_ERROR",
            "cause": "NETWORK", "port": "mlx5_3/1", "switch": None}  # fmt: skip
    event = event_for("StragglerFinding", link)
    assert event is not None and event.attributes["network.interface.name"] == "mlx5_3/1"
    assert "peerwatch.switch" not in event.attributes and "gpu.index" not in event.attributes
    leaf = {**link, "node": None, "port": None, "switch": "leaf07", "status": "FLEET_WIDE"}
    event = event_for("StragglerFinding", leaf)
    assert event is not None and event.attributes["peerwatch.switch"] == "leaf07"
    assert "network.interface.name" not in event.attributes
    rec = {**records["DrainRecommendation"], "cause": "NETWORK", "port": "eth0"}
    event = event_for("DrainRecommendation", rec)
    assert event is not None and event.attributes["network.interface.name"] == "eth0"
    # A GPU's finding names no port.
    plain = event_for("StragglerFinding", records["StragglerFinding"])
    assert plain is not None and "network.interface.name" not in plain.attributes


# --- SDK wiring ---------------------------------------------------------------------------------


def test_per_gpu_series_never_overwrite_each_other(
    sink: OtlpSink, reader: InMemoryMetricReader, records: dict[str, Any]
) -> None:
    base = records["GpuWindow"]
    for gpu in range(4):
        sink.write("GpuWindow", window(base, "1001", "gpu00005", gpu, power_w=600.0 + gpu))
    metrics = collected(reader)
    assert points(metrics["hw.power"]) == {("1001", "gpu00005", g): 600.0 + g for g in range(4)}
    power = metrics["hw.power"]
    assert isinstance(power.data, Gauge) and power.unit == "W"
    attrs = power.data.data_points[0].attributes
    assert attrs is not None
    assert attrs["hw.type"] == "gpu" and attrs["slurm.user"] == "alice"
    hw_ids = {(p.attributes or {}).get("hw.id") for p in power.data.data_points}
    assert hw_ids == {f"GPU-gpu00005-{g:04d}" for g in range(4)}


def test_gauges_take_the_latest_window_and_counters_add_up(
    sink: OtlpSink, reader: InMemoryMetricReader, records: dict[str, Any]
) -> None:
    base = records["GpuWindow"]
    sink.write("GpuWindow", window(base, "1001", "n1", 0, 0, power_w=500.0, energy_j=1000.0,
                                   nvlink_errors_delta=1))  # fmt: skip
    sink.write("GpuWindow", window(base, "1001", "n1", 0, 1, power_w=650.0, energy_j=1500.0,
                                   nvlink_errors_delta=2))  # fmt: skip
    # A redelivered window (at-least-once consumption) must not count twice.
    sink.write("GpuWindow", window(base, "1001", "n1", 0, 1, power_w=1.0, energy_j=1500.0,
                                   nvlink_errors_delta=2))  # fmt: skip
    metrics = collected(reader)
    assert points(metrics["hw.power"]) == {("1001", "n1", 0): 650.0}
    energy = metrics["hw.energy"]
    assert isinstance(energy.data, Sum) and energy.data.is_monotonic and energy.unit == "J"
    assert points(energy) == {("1001", "n1", 0): 2500.0}
    assert points(metrics["hw.errors"])[("1001", "n1", 0, "nvlink")] == 3
    assert sink.stats()["window_out_of_order"] == 1


def test_ended_job_series_stop_being_exported(
    sink: OtlpSink, reader: InMemoryMetricReader, records: dict[str, Any]
) -> None:
    base = records["GpuWindow"]
    sink.write("GpuWindow", window(base, "1001", "n1", 0))
    sink.write("GpuWindow", window(base, "1002", "n2", 0))
    assert set(points(collected(reader)["hw.power"])) == {("1001", "n1", 0), ("1002", "n2", 0)}
    sink.write("JobEvent", {**records["JobEvent"], "job_id": "1002", "kind": "ENDED"})
    assert set(points(collected(reader)["hw.power"])) == {("1001", "n1", 0)}
    # A late window of the ended job does not bring the series back ...
    sink.write("GpuWindow", window(base, "1002", "n2", 0, 5))
    assert set(points(collected(reader)["hw.power"])) == {("1001", "n1", 0)}
    # ... until the job runs again (requeue keeps the id).
    sink.write("JobEvent", {**records["JobEvent"], "job_id": "1002", "kind": "STARTED"})
    sink.write("GpuWindow", window(base, "1002", "n2", 0, 6))
    assert ("1002", "n2", 0) in points(collected(reader)["hw.power"])
    assert sink.stats()["series_ended"] == 1 and sink.stats()["window_of_ended_job"] == 1


def test_series_without_windows_expire(
    sink: OtlpSink, reader: InMemoryMetricReader, clock: FakeClock, records: dict[str, Any]
) -> None:
    base = records["GpuWindow"]
    sink.write("GpuWindow", window(base, "1001", "n1", 0))
    clock.ms += 500_000
    sink.write("GpuWindow", window(base, "1003", "n3", 0))
    clock.ms += 200_000  # 700 s after the first, 200 s after the second; stale_after_s = 600
    assert set(points(collected(reader)["hw.power"])) == {("1003", "n3", 0)}
    assert sink.stats()["series_stale"] == 1


def test_series_cap_drops_the_oldest_and_counts(
    sink: OtlpSink, reader: InMemoryMetricReader, clock: FakeClock, records: dict[str, Any]
) -> None:
    base = records["GpuWindow"]
    for gpu in range(7):  # cap is 5
        clock.ms += 1_000
        sink.write("GpuWindow", window(base, "1001", "n1", gpu))
    metrics = collected(reader)
    assert set(points(metrics["hw.power"])) == {("1001", "n1", g) for g in range(2, 7)}
    assert sink.stats()["series_cap"] == 2
    discarded = {p.attributes["reason"]: p.value
                 for p in metrics["peerwatch.exporter.discarded"].data.data_points}  # fmt: skip
    assert discarded["series_cap"] == 2
    assert metrics["peerwatch.exporter.series.active"].data.data_points[0].value == 5


def test_events_are_emitted_as_log_records(
    sink: OtlpSink, log_exporter: InMemoryLogRecordExporter, records: dict[str, Any]
) -> None:
    for name in ("StragglerFinding", "DrainRecommendation", "HealthCheckResult", "DrainAction"):
        sink.write(name, records[name])
    assert sink.flush(5.0)
    logs = log_exporter.get_finished_logs()
    by_name = {r.log_record.event_name: r for r in logs}
    assert set(by_name) == {"peerwatch.straggler.finding", "peerwatch.drain.recommendation",
                            "peerwatch.health.result", "peerwatch.drain.action"}  # fmt: skip
    finding = by_name["peerwatch.straggler.finding"].log_record
    assert finding.timestamp == records["StragglerFinding"]["window_end_ms"] * 1_000_000
    assert (
        finding.attributes is not None
        and finding.attributes["peerwatch.finding.status"] == "CONFIRMED"
    )
    assert isinstance(finding.body, dict) and finding.body["reason"].startswith("gpu 3 clock")
    assert (
        by_name["peerwatch.drain.recommendation"].resource.attributes["service.name"] == "peerwatch"
    )
    assert sink.stats()["events_exported"] == 4


def test_unmappable_record_raises_export_error(sink: OtlpSink, records: dict[str, Any]) -> None:
    broken = dict(records["GpuWindow"])
    del broken["node"]
    with pytest.raises(ExportError, match="GpuWindow"):
        sink.write("GpuWindow", broken)
    with pytest.raises(ExportError, match="StragglerFinding"):
        sink.write("StragglerFinding", {"job_id": "1"})


@pytest.mark.parametrize(
    ("changes", "field"),
    [({"protocol": "udp"}, "export.protocol"), ({"endpoint": "127.0.0.1:4317"}, "export.endpoint"),
     ({"interval_s": 0}, "export.interval_s"), ({"max_series": 0}, "export.max_series"),
     ({"event_batch_size": 4096}, "export.event_batch_size")],
)  # fmt: skip
def test_config_validation_names_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        ExportSettings(**changes)
    assert info.value.field == field


def test_http_signal_urls() -> None:
    assert signal_url("http://127.0.0.1:4318", "metrics") == "http://127.0.0.1:4318/v1/metrics"
    assert signal_url("http://h:4318/", "logs") == "http://h:4318/v1/logs"
    assert signal_url("http://h:4318/v1/logs", "logs") == "http://h:4318/v1/logs"


# --- findings and recommendations as counters ---------------------------------------------------


def event_points(metric: Any) -> dict[tuple[tuple[str, Any], ...], float]:
    return {tuple(sorted((p.attributes or {}).items())): p.value for p in metric.data.data_points}


def test_findings_and_recommendations_are_counted_once_per_id(
    sink: OtlpSink, reader: InMemoryMetricReader, records: dict[str, Any]
) -> None:
    finding = {**records["StragglerFinding"], "job_id": "1001", "node": "gpu00005",
               "gpu_index": 3, "status": "CONFIRMED", "cause": "THERMAL"}  # fmt: skip
    sink.write("StragglerFinding", {**finding, "finding_id": "f-1"})
    sink.write("StragglerFinding", {**finding, "finding_id": "f-1"})  # redelivered: not again
    sink.write("StragglerFinding", {**finding, "finding_id": "f-2"})
    sink.write("StragglerFinding", {**finding, "finding_id": "f-3", "status": "CLEARED"})
    rec = {**records["DrainRecommendation"], "node": "gpu00005", "action": "DRAIN",
           "severity": "CRITICAL", "hard": False, "cause": "THERMAL"}  # fmt: skip
    sink.write("DrainRecommendation", {**rec, "recommendation_id": "r-1"})
    sink.write("DrainRecommendation", {**rec, "recommendation_id": "r-1"})
    metrics = collected(reader)
    findings = metrics["peerwatch.findings"]
    assert isinstance(findings.data, Sum) and findings.data.is_monotonic
    confirmed = (("gpu.index", 3), ("host.name", "gpu00005"),
                 ("peerwatch.finding.cause", "THERMAL"),
                 ("peerwatch.finding.status", "CONFIRMED"), ("slurm.job.id", "1001"))  # fmt: skip
    cleared = tuple((k, "CLEARED" if k == "peerwatch.finding.status" else v) for k, v in confirmed)
    assert event_points(findings) == {confirmed: 2, cleared: 1}
    recs = event_points(metrics["peerwatch.recommendations"])
    assert list(recs.values()) == [1]
    assert dict(next(iter(recs))) == {
        "host.name": "gpu00005", "peerwatch.recommendation.action": "DRAIN",
        "peerwatch.recommendation.severity": "CRITICAL",
        "peerwatch.recommendation.cause": "THERMAL", "peerwatch.recommendation.hard": False,
    }  # fmt: skip
    assert sink.stats()["event_count_duplicate"] == 2


def test_a_jobs_finding_counters_linger_after_the_job_ends_then_go(
    sink: OtlpSink, reader: InMemoryMetricReader, records: dict[str, Any], clock: FakeClock
) -> None:
    finding = {**records["StragglerFinding"], "job_id": "1001", "finding_id": "f-1"}
    sink.write("StragglerFinding", finding)
    sink.write("StragglerFinding", {**finding, "job_id": "1002", "finding_id": "f-2"})
    sink.write("JobEvent", {**records["JobEvent"], "job_id": "1001", "kind": "ENDED"})

    def jobs() -> set[str]:
        return {
            str((p.attributes or {})["slurm.job.id"])
            for p in collected(reader)["peerwatch.findings"].data.data_points
        }

    # A job failing at once (its GPU fell off the bus) still has its findings counted ...
    assert jobs() == {"1001", "1002"}
    clock.ms += 599_000  # the sink's stale_after_s is 600
    assert jobs() == {"1001", "1002"}
    clock.ms += 2_000
    assert jobs() == {"1002"}  # ... and they go after the linger time


def test_series_per_gpu_window_counts_the_mapping(records: dict[str, Any]) -> None:
    from peerwatch.exporters.otlp import series_per_gpu_window

    # A window with every field set produces one point per series of its GPU.
    full = {**records["GpuWindow"], "score": 1.0, "step_ms": 1500.0}
    assert len(window_points(full)) == series_per_gpu_window() == 13


def test_the_series_estimate_in_the_docs_is_the_mapping_s() -> None:
    from pathlib import Path

    from peerwatch.exporters.otlp import series_per_gpu_window

    doc = (Path(__file__).parents[2] / "docs" / "prometheus.md").read_text()
    per_gpu = series_per_gpu_window()
    assert f"{per_gpu}\nseries per GPU" in doc or f"{per_gpu} series per GPU" in doc
    assert f"{100_000 * per_gpu:,} active series" in doc
