"""Pure mapping from peerwatch records to OpenTelemetry metric points and log events.

No SDK, no I/O: functions of dicts, so they are tested without a collector. The SDK wiring is
:mod:`peerwatch.exporters.otlp_sdk`; the bounded series store is :mod:`peerwatch.exporters.series`.

Metrics (one data point per GPU per job; every point carries the GPU's identity, so series of
different GPUs never overwrite each other):

=================================== ======= ======= =====================================
name                                unit    kind    source (GpuWindow field)
=================================== ======= ======= =====================================
``hw.gpu.utilization``              1       gauge   ``sm_frac`` (0..1)
``hw.power``                        W       gauge   ``power_w`` (already watts, not mW)
``hw.temperature``                  Cel     gauge   ``temperature_c_max``
``hw.energy``                       J       counter ``energy_j`` (summed over windows)
``hw.errors``                       {error} counter ``*_delta`` with ``error.type``
``peerwatch.gpu.sm_clock.ratio``    1       gauge   ``clk_ratio``
``peerwatch.gpu.throttle.ratio``    1       gauge   ``throttle_frac``
``peerwatch.gpu.power_cap.ratio``   1       gauge   ``power_cap_frac``
``peerwatch.gpu.power_limit.ratio`` 1       gauge   ``power_ratio``
``peerwatch.training.step.duration`` s      gauge   ``step_ms`` / 1000
``peerwatch.straggler.score``       1       gauge   ``score`` (absent when gated)
=================================== ======= ======= =====================================

Events counted (cumulative counters, each finding or recommendation id counted once):

=================================== ======================= ==========================================
``peerwatch.findings``              {finding}               StragglerFindings by status, cause, job,
                                                            node and GPU
``peerwatch.recommendations``       {recommendation}        DrainRecommendations by action, severity,
                                                            cause, hard and node
=================================== ======================= ==========================================

Events of the network (cause NETWORK) also carry ``network.interface.name`` (the port) and
``peerwatch.switch`` (a leaf switch), as the per-port metrics (:mod:`.otlp_nic`) name them.

Attributes: ``host.name``, ``hw.id`` (GPU UUID, else ``<node>/gpu<index>``), ``hw.type=gpu``,
``gpu.index``, ``slurm.job.id`` and, where known, ``slurm.user``, ``slurm.partition``,
``slurm.account``. The ``hw.*`` names follow the (development) hardware semantic conventions;
SM clock, throttling, power cap and straggler score have none, hence ``peerwatch.*``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from opentelemetry._logs import SeverityNumber

AttrValue = str | bool | int | float | Sequence[str] | Sequence[int]
Attributes = Mapping[str, AttrValue]
MetricKind = Literal["gauge", "counter"]
#: One GPU in one job: ``(job_id, node, gpu_index)``.
SeriesKey = tuple[str, str, int]
#: What a :class:`~peerwatch.exporters.series.SeriesStore` keys its series by: a GPU in a job,
#: or a port of a node ``(node, port name)``.
StoreKey = SeriesKey | tuple[str, str]


@dataclass(frozen=True)
class MetricSpec:
    """An exported instrument. ``counter`` values are increments, exported as a cumulative sum."""

    name: str
    unit: str
    kind: MetricKind
    description: str


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("hw.gpu.utilization", "1", "gauge", "Mean SM activity over the window (0..1)."),
    MetricSpec("hw.power", "W", "gauge", "Mean power draw over the window, watts."),
    MetricSpec("hw.temperature", "Cel", "gauge", "Highest GPU temperature in the window."),
    MetricSpec("hw.energy", "J", "counter", "Energy used by the GPU in this job, joules."),
    MetricSpec("hw.errors", "{error}", "counter", "GPU errors in this job, by error.type."),
    MetricSpec("peerwatch.gpu.sm_clock.ratio", "1", "gauge", "Mean SM clock / max SM clock."),
    MetricSpec("peerwatch.gpu.throttle.ratio", "1", "gauge",
               "Share of the window in HW slowdown, thermal or power-brake throttling."),
    MetricSpec("peerwatch.gpu.power_cap.ratio", "1", "gauge",
               "Share of the window at the software power cap."),
    MetricSpec("peerwatch.gpu.power_limit.ratio", "1", "gauge",
               "Mean power / enforced power limit."),
    MetricSpec("peerwatch.training.step.duration", "s", "gauge",
               "Median training step duration of the rank on this GPU, seconds."),
    MetricSpec("peerwatch.straggler.score", "1", "gauge",
               "Straggler score: largest robust z in the slow direction (absent when gated)."),
)  # fmt: skip
METRICS_BY_NAME: dict[str, MetricSpec] = {m.name: m for m in METRICS}
#: Counters of events (not of windows): see :func:`event_count`.
FINDINGS = MetricSpec(
    "peerwatch.findings",
    "{finding}",
    "counter",
    "StragglerFindings published, by status and cause.",
)
RECOMMENDATIONS = MetricSpec(
    "peerwatch.recommendations",
    "{recommendation}",
    "counter",
    "DrainRecommendations published, by action, severity and cause.",
)
EVENT_COUNTERS: tuple[MetricSpec, ...] = (FINDINGS, RECOMMENDATIONS)  # fmt: skip

# (metric name, GpuWindow field, scale): the plain one-field gauges.
_GAUGES: tuple[tuple[str, str, float], ...] = (
    ("hw.gpu.utilization", "sm_frac", 1.0),
    ("hw.power", "power_w", 1.0),
    ("hw.temperature", "temperature_c_max", 1.0),
    ("peerwatch.gpu.sm_clock.ratio", "clk_ratio", 1.0),
    ("peerwatch.gpu.throttle.ratio", "throttle_frac", 1.0),
    ("peerwatch.gpu.power_cap.ratio", "power_cap_frac", 1.0),
    ("peerwatch.gpu.power_limit.ratio", "power_ratio", 1.0),
    ("peerwatch.training.step.duration", "step_ms", 1e-3),
    ("peerwatch.straggler.score", "score", 1.0),
)
#: Attributes naming the GPU and job of a series (set by :func:`gpu_attributes`), or the port
#: of a node (set by :func:`peerwatch.exporters.otlp_nic.port_attributes`).
IDENTITY_ATTRIBUTES = frozenset(
    {"host.name", "hw.id", "hw.type", "gpu.index", "slurm.job.id", "slurm.user",
     "slurm.partition", "slurm.account", "network.interface.name", "peerwatch.nic.device",
     "peerwatch.nic.kind", "peerwatch.nic.link_layer"}
)  # fmt: skip
#: ``error.type`` value -> GpuWindow delta field.
ERROR_TYPES: dict[str, str] = {
    "ecc_uncorrected": "ecc_uncorrected_delta",
    "nvlink": "nvlink_errors_delta",
    "pcie_replay": "pcie_replay_delta",
}


@dataclass(frozen=True)
class MetricPoint:
    """One value of one metric for one GPU. For counters ``value`` is the window's increment."""

    name: str
    value: float
    attributes: Attributes
    kind: MetricKind = "gauge"


def series_key(window: Mapping[str, Any]) -> SeriesKey:
    """The series a GpuWindow belongs to: ``(job_id, node, gpu_index)``."""
    return (str(window["job_id"]), str(window["node"]), int(window["gpu_index"]))


def gpu_attributes(window: Mapping[str, Any]) -> dict[str, AttrValue]:
    """The identity attributes of a GpuWindow's GPU and job; unknown Slurm fields are left out."""
    node, index = str(window["node"]), int(window["gpu_index"])
    attrs: dict[str, AttrValue] = {
        "host.name": node,
        "hw.id": window.get("gpu_uuid") or f"{node}/gpu{index}",
        "hw.type": "gpu",
        "gpu.index": index,
        "slurm.job.id": str(window["job_id"]),
    }
    for attr, field in (
        ("slurm.user", "user"),
        ("slurm.partition", "partition"),
        ("slurm.account", "account"),
    ):
        if window.get(field):
            attrs[attr] = str(window[field])
    return attrs


def _finite(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def window_points(window: Mapping[str, Any]) -> list[MetricPoint]:
    """The metric points of one GpuWindow record (see the module table).

    Null or non-finite fields produce no point (a gated window has no score point). Raises
    KeyError when an identity field (job_id, node, gpu_index) is missing.
    """
    attrs = gpu_attributes(window)
    points: list[MetricPoint] = []
    for name, field, scale in _GAUGES:
        value = _finite(window.get(field))
        if value is not None:
            points.append(MetricPoint(name, value * scale, attrs))
    energy_j = _finite(window.get("energy_j"))
    if energy_j is not None and energy_j >= 0:
        points.append(MetricPoint("hw.energy", energy_j, attrs, "counter"))
    for error_type, field in ERROR_TYPES.items():
        delta = _finite(window.get(field))
        # A counter reset on the node shows as a negative delta: not an error count.
        if delta is not None and delta >= 0:
            points.append(
                MetricPoint("hw.errors", delta, {**attrs, "error.type": error_type}, "counter")
            )
    return points


def series_per_gpu_window() -> int:
    """The most series one GPU in one job exports (every gauge, energy, one ``hw.errors`` per
    error type): the unit of the cardinality estimate in docs/prometheus.md."""
    gauges = sum(m.kind == "gauge" for m in METRICS)
    return gauges + 1 + len(ERROR_TYPES)


@dataclass(frozen=True)
class EventCount:
    """One event to count once: ``event_id`` (the record's deterministic id), the counter and the
    attributes of its series."""

    event_id: str
    name: str
    attributes: Attributes
    job_id: str | None


def event_count(schema_name: str, record: Mapping[str, Any]) -> EventCount | None:
    """The counter increment of a StragglerFinding or DrainRecommendation; None for other schemas.

    Findings are counted per status, cause, job, node and GPU (a finding is about one GPU of one
    job, so these series are at most the job-window series); recommendations per action,
    severity, cause, hard and node (no job: they outlive jobs). Raises KeyError when a required
    field is missing.
    """
    if schema_name == "StragglerFinding":
        attrs: dict[str, AttrValue] = {
            "peerwatch.finding.status": str(record["status"]),
            "peerwatch.finding.cause": str(record.get("cause") or "UNKNOWN"),
            "slurm.job.id": str(record["job_id"]),
        }
        _put(attrs, "host.name", record.get("node"))
        _put(attrs, "gpu.index", record.get("gpu_index"))
        return EventCount(str(record["finding_id"]), FINDINGS.name, attrs, str(record["job_id"]))
    if schema_name == "DrainRecommendation":
        attrs = {
            "peerwatch.recommendation.action": str(record["action"]),
            "peerwatch.recommendation.severity": str(record["severity"]),
            "peerwatch.recommendation.cause": str(record.get("cause") or "UNKNOWN"),
            "peerwatch.recommendation.hard": bool(record["hard"]),
            "host.name": str(record["node"]),
        }
        return EventCount(str(record["recommendation_id"]), RECOMMENDATIONS.name, attrs, None)
    return None


@dataclass(frozen=True)
class LogEvent:
    """One OTLP log record (an event): ``body`` is the record without null fields."""

    event_name: str
    timestamp_ms: int
    severity_number: SeverityNumber
    severity_text: str
    body: Mapping[str, Any]
    attributes: Attributes


_SEVERITY: dict[str, SeverityNumber] = {
    "INFO": SeverityNumber.INFO,
    "WARN": SeverityNumber.WARN,
    "ERROR": SeverityNumber.ERROR,
}
_FINDING_SEVERITY = {"CONFIRMED": "WARN", "HARD_ERROR": "ERROR", "UNKNOWN": "WARN"}
_LEVEL_SEVERITY = {"CRITICAL": "ERROR", "WARNING": "WARN", "UNKNOWN": "WARN"}
_DECISION_SEVERITY = {"DRAINED": "WARN", "REFUSED": "WARN", "UNKNOWN": "WARN"}


def without_nulls(value: Any) -> Any:
    """``value`` with None dropped from maps and lists (OTLP AnyValue has no null)."""
    if isinstance(value, Mapping):
        return {str(k): without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [without_nulls(v) for v in value if v is not None]
    return value


def _put(attrs: dict[str, AttrValue], key: str, value: Any) -> None:
    if value is not None:
        attrs[key] = value


def _put_network(attrs: dict[str, AttrValue], record: Mapping[str, Any]) -> None:
    """The port (``network.interface.name``, as the per-port metrics name it) and leaf switch
    (``peerwatch.switch``) a network finding or recommendation names."""
    if record.get("port"):
        attrs["network.interface.name"] = str(record["port"])
    if record.get("switch"):
        attrs["peerwatch.switch"] = str(record["switch"])


def _event(
    name: str, ts_ms: int, level: str, record: Mapping[str, Any], attrs: dict[str, AttrValue]
) -> LogEvent:
    return LogEvent(name, int(ts_ms), _SEVERITY[level], level, without_nulls(record), attrs)


def finding_event(finding: Mapping[str, Any]) -> LogEvent:
    """A StragglerFinding as event ``peerwatch.straggler.finding`` (time: window end)."""
    attrs: dict[str, AttrValue] = {
        "peerwatch.finding.id": finding["finding_id"],
        "peerwatch.finding.status": finding["status"],
        "slurm.job.id": finding["job_id"],
        "peerwatch.windows.flagged": finding["windows_flagged"],
        "peerwatch.windows.considered": finding["windows_considered"],
        "peerwatch.peer_group.size": finding["peer_group_size"],
    }
    _put(attrs, "host.name", finding.get("node"))
    _put(attrs, "gpu.index", finding.get("gpu_index"))
    _put(attrs, "hw.id", finding.get("gpu_uuid"))
    _put(attrs, "peerwatch.cause", finding.get("cause"))
    _put_network(attrs, finding)
    _put(attrs, "peerwatch.detected_ms", finding.get("detected_ms"))
    if finding.get("hard_rules"):
        attrs["peerwatch.hard_rules"] = [str(r) for r in finding["hard_rules"]]
    level = _FINDING_SEVERITY.get(str(finding["status"]), "INFO")
    return _event("peerwatch.straggler.finding", finding["window_end_ms"], level, finding, attrs)


def recommendation_event(rec: Mapping[str, Any]) -> LogEvent:
    """A DrainRecommendation as event ``peerwatch.drain.recommendation``."""
    attrs: dict[str, AttrValue] = {
        "peerwatch.recommendation.id": rec["recommendation_id"],
        "peerwatch.recommendation.action": rec["action"],
        "peerwatch.recommendation.hard": bool(rec["hard"]),
        "host.name": rec["node"],
        "gpu.indices": [int(i) for i in rec.get("gpu_indices") or []],
        "slurm.job.ids": [str(j) for j in rec.get("job_ids") or []],
    }
    _put(attrs, "slurm.partition", rec.get("partition"))
    _put(attrs, "peerwatch.cause", rec.get("cause"))
    _put_network(attrs, rec)
    level = _LEVEL_SEVERITY.get(str(rec["severity"]), "INFO")
    return _event("peerwatch.drain.recommendation", rec["ts_ms"], level, rec, attrs)


def health_event(result: Mapping[str, Any]) -> LogEvent:
    """A HealthCheckResult as event ``peerwatch.health.result``."""
    attrs: dict[str, AttrValue] = {
        "peerwatch.health.id": result["event_id"],
        "peerwatch.health.phase": result["phase"],
        "peerwatch.health.status": result["status"],
        "peerwatch.health.exit_code": int(result["exit_code"]),
        "host.name": result["node"],
    }
    _put(attrs, "slurm.job.id", result.get("job_id"))
    failed = [c["name"] for c in result.get("checks") or [] if c.get("status") != "OK"]
    if failed:
        attrs["peerwatch.health.failed_checks"] = failed
    level = _LEVEL_SEVERITY.get(str(result["status"]), "INFO")
    return _event("peerwatch.health.result", result["ts_ms"], level, result, attrs)


def action_event(action: Mapping[str, Any]) -> LogEvent:
    """A DrainAction as event ``peerwatch.drain.action`` (the audit trail)."""
    attrs: dict[str, AttrValue] = {
        "peerwatch.action.id": action["action_id"],
        "peerwatch.action.decision": action["decision"],
        "peerwatch.action.mode": action["mode"],
        "host.name": action["node"],
    }
    _put(attrs, "peerwatch.recommendation.id", action.get("recommendation_id"))
    _put(attrs, "peerwatch.action.refusal", action.get("refusal"))
    _put(attrs, "slurm.partition", action.get("partition"))
    level = _DECISION_SEVERITY.get(str(action["decision"]), "INFO")
    return _event("peerwatch.drain.action", action["ts_ms"], level, action, attrs)


EVENT_MAPPERS = {
    "StragglerFinding": finding_event,
    "DrainRecommendation": recommendation_event,
    "HealthCheckResult": health_event,
    "DrainAction": action_event,
}


def event_for(schema_name: str, record: Mapping[str, Any]) -> LogEvent | None:
    """The log event for a record, or None for schemas that are not events (e.g. GpuWindow).

    Raises KeyError when a required field is missing.
    """
    mapper = EVENT_MAPPERS.get(schema_name)
    return mapper(record) if mapper else None
