"""Findings and recommendations as Alertmanager alerts: the pure state machine (no I/O, no clock).

:class:`AlertBook` folds StragglerFinding, DrainRecommendation and JobEvent records into alerts
identified by their label set, as Prometheus holds the alerts of its rules, and says which to
send (``due``) and in which form (:func:`to_api`, Alertmanager's v2 JSON). The caller passes the
wall time ``now_ms``; every decision about a record uses the record's own event time, so
replaying the topics after a restart rebuilds the same alerts with the same labels.

* A finding opens an alert per (alertname, job, node, GPU): CONFIRMED -> ``GpuStraggler``
  (warning), HARD_ERROR -> ``GpuHardError`` (critical), SILENT -> ``NodeSilent`` (warning),
  JOB_WIDE / FLEET_WIDE -> ``JobWideSlowdown`` / ``FleetWideShift`` (info). SUSPECT opens none
  (a candidate; the drain policy turns one worth telling into an ALERT recommendation). A later
  finding of the same kind refreshes it (CONFIRMED is re-emitted as a heartbeat); it ends at
  the CLEARED finding of the same job, node and GPU, when the job ENDED, or ``finding_ttl``
  after its last refresh; a hard error (the GPU's, not the job's) only by the TTL. Its labels are fixed when it opens; later evidence updates the
  annotations only (a changed label set would be a second alert).
* A recommendation opens ``NodeDrainRecommended`` (DRAIN) or ``NodeAlert`` (ALERT) with the
  record's severity; the same labels again extend it; it ends at ``expires_ms``.
* Labels: ``alertname``, ``severity``, ``job_id``, ``node``, ``gpu``, ``cause`` and, for the
  network (cause ``network``), ``port`` (``mlx5_0/1``, ``eth0``), ``device`` (its HCA or
  interface: ``mlx5_0``) and ``switch`` (a leaf-switch finding), so on-call routes and silences
  a link, a NIC or a switch (Alertmanager matchers on ``port``/``switch``).
* Alerts are re-sent every ``resend`` while firing and for ``resolved_retention`` after they
  end (Prometheus does the same), then forgotten.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from peerwatch.streams.core.findings import describe_feature
from peerwatch.streams.core.model import is_idle_job

GPU_STRAGGLER = "GpuStraggler"
GPU_HARD_ERROR = "GpuHardError"
NODE_SILENT = "NodeSilent"
JOB_WIDE_SLOWDOWN = "JobWideSlowdown"
FLEET_WIDE_SHIFT = "FleetWideShift"
NODE_DRAIN = "NodeDrainRecommended"
NODE_ALERT = "NodeAlert"

#: Finding status -> (alertname, severity). Statuses not here open no alert.
FINDING_ALERTS: dict[str, tuple[str, str]] = {
    "CONFIRMED": (GPU_STRAGGLER, "warning"),
    "HARD_ERROR": (GPU_HARD_ERROR, "critical"),
    "SILENT": (NODE_SILENT, "warning"),
    "JOB_WIDE": (JOB_WIDE_SLOWDOWN, "info"),
    "FLEET_WIDE": (FLEET_WIDE_SHIFT, "info"),
}
#: Alerts of an episode in a job, ended by a CLEARED finding or the job's end. A hard error is
#: the GPU's, not the job's: it has no episode to clear and outlives the job (it times out).
EPISODIC = frozenset({GPU_STRAGGLER, NODE_SILENT, JOB_WIDE_SLOWDOWN, FLEET_WIDE_SHIFT})
SEVERITIES: dict[str, str] = {"INFO": "info", "WARNING": "warning", "CRITICAL": "critical"}

#: The runbook line of each cause (annotation ``runbook``).
RUNBOOK: dict[str, str] = {
    "THERMAL": "HW thermal slowdown: check the node's fans, airflow and inlet temperature and the "
    "GPU's (nvidia-smi -q -d TEMPERATURE,PERFORMANCE); drain and service it if it persists.",
    "POWER": "Power brake or SW power cap: check the node's power supplies and the GPU's power "
    "limit (nvidia-smi -q -d POWER); a brake signal points at the PSU or BMC.",
    "CLOCKS": "Application clocks lowered: reset them (nvidia-smi -rac) and find who set them "
    "(prolog, the job itself).",
    "LINK": "PCIe/NVLink degraded: check link width and errors (nvidia-smi -q -d PCIE; "
    "nvidia-smi nvlink -e); reseat or service the GPU.",
    "HOST": "Low SM activity with normal clocks: look at the host (CPU, data loader, storage, "
    "NIC) before the GPU.",
    "HARDWARE": "Hard error (XID, ECC, row remap, lost GPU): drain the node and run the vendor "
    "diagnostics (dcgmi diag -r 3) before resuming it.",
    "NO_SAMPLES": "The node stopped sending samples: check the node is up and its peerwatch "
    "agent runs (systemctl status peerwatch-agent).",
    "NETWORK": "NIC port or leaf switch: check the port (ibstat; perfquery -x for its counters; "
    "ethtool -S for a netdev), its cable and transceiver and the switch port; a port down on an "
    "allocated node tears the job's NCCL connections. Several nodes under one switch: look at "
    "the switch, not at each node.",
    "UNKNOWN": "Compare the GPU with its peers (clock, throttle reasons, SM activity, power) in "
    "the job's report; drain the node if it stays slow.",
}
#: Longest label value and annotation kept (values come from Slurm and users).
LABEL_MAX_CHARS = 128
ANNOTATION_MAX_CHARS = 1024

LabelSet = tuple[tuple[str, str], ...]
#: alertname, job_id, node, gpu, port, switch ("" when absent).
FindingKey = tuple[str, str, str, str, str, str]


@dataclass
class Alert:
    """One alert: its labels (identity), annotations and lifetime, in ms (UTC)."""

    labels: LabelSet
    annotations: dict[str, str]
    starts_ms: int
    #: Firing until then unless refreshed: a recommendation's expiry, a finding's last refresh
    #: plus the TTL.
    valid_until_ms: int
    #: Set when the alert ended (resolved).
    ends_ms: int | None = None
    #: Wall time it was last handed to Alertmanager; None: not since this process started.
    sent_ms: int | None = None
    #: Changed since it was last sent: send at the next tick.
    dirty: bool = True

    @property
    def firing(self) -> bool:
        return self.ends_ms is None

    def end(self, at_ms: int) -> None:
        if self.ends_ms is None:
            self.ends_ms = max(at_ms, self.starts_ms)
            self.dirty = True


@dataclass
class BookStats:
    """What the book did with the records it was given."""

    records: int = 0
    ignored: int = 0
    opened: int = 0
    refreshed: int = 0
    resolved: int = 0
    forgotten: int = 0
    dropped_full: int = 0


class BadAlertRecord(ValueError):
    """A record lacks what its alert needs (the caller dead-letters it)."""


def clean(text: object, limit: int) -> str:
    """``text`` without control characters, at most ``limit`` characters."""
    s = "".join(ch for ch in str(text) if unicodedata.category(ch)[0] != "C" or ch == " ")
    return s if len(s) <= limit else s[: limit - 1] + "…"


def labels_of(items: Mapping[str, str]) -> LabelSet:
    """A sorted label set; empty values are left out (Alertmanager treats them as absent)."""
    return tuple(sorted((k, clean(v, LABEL_MAX_CHARS)) for k, v in items.items() if v))


def iso_ms(ms: int) -> str:
    """RFC 3339 with milliseconds, UTC (``2026-12-01T16:55:00.000Z``)."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def _job_label(job_id: object) -> str:
    job = str(job_id or "")
    return "" if is_idle_job(job) else job


def device_of(port: str) -> str:
    """The NIC a port name belongs to: the HCA of ``mlx5_0/1`` (``mlx5_0``), the interface of a
    netdev (``eth0``); "" for no port."""
    return port.split("/", 1)[0]


def network_labels(record: Mapping[str, Any]) -> dict[str, str]:
    """``port``, ``device`` and ``switch`` of a finding or recommendation (empty when absent)."""
    port = str(record.get("port") or "")
    return {"port": port, "device": device_of(port), "switch": str(record.get("switch") or "")}


def _event_ms(record: Mapping[str, Any]) -> int:
    for name in ("detected_ms", "window_end_ms", "ts_ms"):
        value = record.get(name)
        if value is not None:
            return int(value)
    raise BadAlertRecord("no event time (detected_ms, window_end_ms, ts_ms)")


def finding_annotations(record: Mapping[str, Any], alertname: str) -> dict[str, str]:
    """Summary, description (the reason and the windows), evidence, runbook and ids."""
    job, node, gpu = _job_label(record.get("job_id")), record.get("node"), record.get("gpu_index")
    cause = str(record.get("cause") or "UNKNOWN")
    port, switch = record.get("port"), record.get("switch")
    where = f"GPU {gpu} on {node}" if gpu is not None else str(node or "")
    if port:
        where = f"port {port} of {node}"
    elif switch and not node:
        where = f"leaf switch {switch}"
    in_job = f" in job {job}" if job else ""
    summary = {
        GPU_STRAGGLER: f"{where} runs slow against its peers{in_job} ({cause.lower()})",
        GPU_HARD_ERROR: f"{where}: hard error{in_job}",
        NODE_SILENT: f"{where or 'a node'} stopped sending samples{in_job}",
        JOB_WIDE_SLOWDOWN: f"job {job}: its GPUs slowed down together; no GPU blamed",
        FLEET_WIDE_SHIFT: f"{where}: a symptom shared by the nodes under it"
        if switch
        else f"a shift shared by the partition or the fleet{in_job}",
    }[alertname]
    evidence = [describe_feature(ev) for ev in record.get("features") or []]
    evidence += [f"rule {r}" for r in record.get("hard_rules") or []]
    flagged, considered = record.get("windows_flagged") or 0, record.get("windows_considered") or 0
    description = str(record.get("reason") or "")
    if considered:
        description += f"; {flagged}/{considered} windows flagged"
    if record.get("peer_group_size"):
        description += f"; {record['peer_group_size']} peers"
    out = {
        "summary": summary,
        "description": description,
        "evidence": "; ".join(evidence) or "none recorded",
        "runbook": RUNBOOK.get(cause, RUNBOOK["UNKNOWN"]),
        "finding_id": str(record.get("finding_id") or ""),
    }
    if record.get("first_flagged_ms") is not None:
        out["first_flagged"] = iso_ms(int(record["first_flagged_ms"]))
    return {k: clean(v, ANNOTATION_MAX_CHARS) for k, v in out.items() if v}


def recommendation_annotations(record: Mapping[str, Any]) -> dict[str, str]:
    """Summary, description, evidence (each piece's detail), runbook, id and expiry."""
    node, reason = str(record.get("node") or ""), str(record.get("reason") or "")
    cause = str(record.get("cause") or "UNKNOWN")
    verb = "drain recommended" if record.get("action") == "DRAIN" else "alert"
    gpus = ", ".join(str(g) for g in record.get("gpu_indices") or [])
    jobs = ", ".join(str(j) for j in record.get("job_ids") or [])
    description = reason + (f"; GPUs {gpus}" if gpus else "") + (f"; jobs {jobs}" if jobs else "")
    evidence = [f"{e.get('kind')}: {e.get('detail')}" for e in record.get("evidence") or []]
    hard = cause == "HARDWARE" or bool(record.get("hard"))
    out = {
        "summary": f"{node}: {verb}: {reason}",
        "description": description,
        "evidence": "; ".join(evidence) or "none recorded",
        "runbook": RUNBOOK.get(
            "HARDWARE" if hard and cause == "UNKNOWN" else cause, RUNBOOK["UNKNOWN"]
        ),
        "recommendation_id": str(record.get("recommendation_id") or ""),
    }
    if record.get("expires_ms") is not None:
        out["expires"] = iso_ms(int(record["expires_ms"]))
    return {k: clean(v, ANNOTATION_MAX_CHARS) for k, v in out.items() if v}


@dataclass
class AlertBook:
    """The alerts of the findings, recommendations and job events seen so far (module doc).

    Durations in ms. ``max_alerts`` bounds memory: resolved alerts are forgotten first, then new
    alerts are dropped (counted in ``stats.dropped_full``).
    """

    finding_ttl_ms: int
    resend_ms: int
    resolved_retention_ms: int
    max_alerts: int
    alerts: dict[LabelSet, Alert] = field(default_factory=dict)
    stats: BookStats = field(default_factory=BookStats)
    #: (alertname, job, node, gpu) -> labels of its latest alert.
    _findings: dict[FindingKey, LabelSet] = field(default_factory=dict)
    #: job -> the time it ENDED (findings of the job up to then open nothing).
    _ended: dict[str, int] = field(default_factory=dict)

    # -- records ---------------------------------------------------------------------------------
    def apply(self, schema_name: str, record: Mapping[str, Any]) -> None:
        """Fold one decoded record in. Raises :class:`BadAlertRecord` for one it cannot use;
        records of other schemas are ignored."""
        self.stats.records += 1
        if schema_name == "StragglerFinding":
            self.apply_finding(record)
        elif schema_name == "DrainRecommendation":
            self.apply_recommendation(record)
        elif schema_name == "JobEvent":
            self.apply_job_event(record)
        else:
            self.stats.ignored += 1

    def apply_finding(self, record: Mapping[str, Any]) -> None:
        status = str(record.get("status") or "UNKNOWN")
        job = str(record.get("job_id") or "")
        if not job:
            raise BadAlertRecord("finding without job_id")
        node = str(record.get("node") or "")
        gpu = "" if record.get("gpu_index") is None else str(int(record["gpu_index"]))
        net = network_labels(record)
        at_ms = _event_ms(record)
        if status == "CLEARED":
            for name in EPISODIC:
                self._end_finding((name, job, node, gpu, net["port"], net["switch"]), at_ms)
            return
        if status not in FINDING_ALERTS:
            self.stats.ignored += 1  # SUSPECT and UNKNOWN open nothing
            return
        alertname, severity = FINDING_ALERTS[status]
        ended_ms = self._ended.get(job)
        if alertname in EPISODIC and ended_ms is not None and at_ms <= ended_ms:
            self.stats.ignored += 1  # read after the job's end, from before it
            return
        key = (alertname, job, node, gpu, net["port"], net["switch"])
        annotations = finding_annotations(record, alertname)
        current = self.alerts.get(self._findings.get(key, ()))
        if current is not None and current.firing and current.valid_until_ms >= at_ms:
            current.valid_until_ms = max(current.valid_until_ms, at_ms + self.finding_ttl_ms)
            self._refresh(current, annotations)
            return
        labels = labels_of(
            {
                "alertname": alertname,
                "severity": severity,
                "job_id": _job_label(job),
                "node": node,
                "gpu": gpu,
                "cause": str(record.get("cause") or "UNKNOWN").lower(),
                **net,
            }
        )
        if self._open(labels, annotations, at_ms, at_ms + self.finding_ttl_ms):
            self._findings[key] = labels

    def apply_recommendation(self, record: Mapping[str, Any]) -> None:
        node = str(record.get("node") or "")
        if not node:
            raise BadAlertRecord("recommendation without node")
        action = str(record.get("action") or "UNKNOWN")
        if action not in ("DRAIN", "ALERT"):
            self.stats.ignored += 1
            return
        at_ms = _event_ms(record)
        expires = record.get("expires_ms")
        until_ms = int(expires) if expires is not None else at_ms + self.finding_ttl_ms
        labels = labels_of(
            {
                "alertname": NODE_DRAIN if action == "DRAIN" else NODE_ALERT,
                "severity": SEVERITIES.get(str(record.get("severity")), "warning"),
                "node": node,
                "gpu": ",".join(str(g) for g in sorted(record.get("gpu_indices") or [])),
                "job_id": ",".join(
                    sorted(j for j in map(_job_label, record.get("job_ids") or []) if j)
                ),
                "cause": str(record.get("cause") or "UNKNOWN").lower(),
                **network_labels(record),
            }
        )
        annotations = recommendation_annotations(record)
        current = self.alerts.get(labels)
        if current is not None and current.firing and current.valid_until_ms >= at_ms:
            current.valid_until_ms = max(current.valid_until_ms, until_ms)
            self._refresh(current, annotations)
            return
        self._open(labels, annotations, at_ms, until_ms)

    def apply_job_event(self, record: Mapping[str, Any]) -> None:
        job, kind = str(record.get("job_id") or ""), record.get("kind")
        if not job:
            raise BadAlertRecord("job event without job_id")
        if kind in ("STARTED", "REQUEUED"):
            self._ended.pop(job, None)
            return
        if kind != "ENDED":
            return
        at_ms = int(record.get("end_ms") or _event_ms(record))
        self._ended[job] = max(at_ms, self._ended.get(job, at_ms))
        for key in [k for k in self._findings if k[1] == job and k[0] in EPISODIC]:
            self._end_finding(key, at_ms)

    # -- time ------------------------------------------------------------------------------------
    def expire(self, now_ms: int) -> None:
        """End the alerts whose validity ran out by ``now_ms``; forget resolved alerts past the
        retention and job-end marks past the TTL."""
        for alert in self.alerts.values():
            if alert.firing and alert.valid_until_ms <= now_ms:
                alert.end(alert.valid_until_ms)
                self.stats.resolved += 1
        for labels in [
            k
            for k, a in self.alerts.items()
            if a.ends_ms is not None and a.ends_ms + self.resolved_retention_ms < now_ms
        ]:
            del self.alerts[labels]
            self.stats.forgotten += 1
        self._findings = {k: v for k, v in self._findings.items() if v in self.alerts}
        self._ended = {j: t for j, t in self._ended.items() if t + self.finding_ttl_ms >= now_ms}

    def due(self, now_ms: int) -> list[Alert]:
        """Alerts to send now (after :meth:`expire`): changed ones, those never sent by this
        process, and those last sent ``resend`` ago."""
        self.expire(now_ms)
        return [
            a
            for a in self.alerts.values()
            if a.dirty or a.sent_ms is None or now_ms - a.sent_ms >= self.resend_ms
        ]

    @staticmethod
    def mark_sent(alerts: Iterable[Alert], now_ms: int) -> None:
        for alert in alerts:
            alert.sent_ms = now_ms
            alert.dirty = False

    def firing(self) -> list[Alert]:
        return [a for a in self.alerts.values() if a.firing]

    # -- internals -------------------------------------------------------------------------------
    def _refresh(self, alert: Alert, annotations: dict[str, str]) -> None:
        self.stats.refreshed += 1
        if annotations != alert.annotations:
            alert.annotations = annotations
            alert.dirty = True

    def _open(
        self, labels: LabelSet, annotations: dict[str, str], at_ms: int, until_ms: int
    ) -> bool:
        if labels not in self.alerts and len(self.alerts) >= self.max_alerts:
            resolved = sorted(
                (a for a in self.alerts.values() if a.ends_ms is not None),
                key=lambda a: a.ends_ms or 0,
            )
            if not resolved:
                self.stats.dropped_full += 1
                return False
            del self.alerts[resolved[0].labels]
            self.stats.forgotten += 1
        self.alerts[labels] = Alert(labels, annotations, at_ms, max(until_ms, at_ms))
        self.stats.opened += 1
        return True

    def _end_finding(self, key: FindingKey, at_ms: int) -> None:
        alert = self.alerts.get(self._findings.get(key, ()))
        if alert is not None and alert.firing:
            alert.end(at_ms)
            self.stats.resolved += 1


def to_api(alert: Alert, now_ms: int, resend_ms: int) -> dict[str, Any]:
    """The alert as an element of ``POST /api/v2/alerts``.

    startsAt is never in the future; a firing alert's endsAt is at most four resend intervals
    ahead (as Prometheus sets it), so Alertmanager resolves it by itself if this exporter stops;
    an ended alert's endsAt is never in the future, so Alertmanager takes it as resolved now.
    """
    starts_ms = min(alert.starts_ms, now_ms)
    if alert.ends_ms is not None:
        ends_ms = max(min(alert.ends_ms, now_ms), starts_ms)
    else:
        ends_ms = max(min(alert.valid_until_ms, now_ms + 4 * resend_ms), starts_ms)
    return {
        "labels": dict(alert.labels),
        "annotations": dict(alert.annotations),
        "startsAt": iso_ms(starts_ms),
        "endsAt": iso_ms(ends_ms),
    }
