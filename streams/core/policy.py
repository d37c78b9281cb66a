"""The drain policy: findings, health results and node events in, DrainRecommendations out.

Pure and event-driven: ``apply(record, state, settings)`` updates ``state`` in place and returns
DrainRecommendation dicts; time comes from the records. DETECTION.md's rules:

* DRAIN (CRITICAL, hard) on a HARD_ERROR finding or a CRITICAL health-check result;
* DRAIN (WARNING) when a straggler stays CONFIRMED for ``drain_after_confirmed_s`` with clock or
  throttle evidence (the detector re-emits CONFIRMED as a heartbeat while the episode lasts);
* DRAIN (WARNING) for a repeat offender: confirmed, with clock/throttle evidence, in
  ``repeat_offender_jobs`` different jobs within ``repeat_offender_window_s``;
* ALERT (WARNING) for a node-level SILENT finding (its samples stopped), a DRAIN instead only
  with ``drain_on_silent``; job- and fleet-wide silences name no node and recommend nothing;
* ALERT only for a SUSPECT (e.g. low sm alone), a CONFIRMED without clock/throttle evidence, a
  JOB_WIDE finding that names a node (one with ``node`` None has no node to alert on) and a
  WARNING health result. Low sm alone or a job-wide event never drains.

Every recommendation id is ``sha256(node, cause, episode...)``, so a restart that replays the
same records produces the same ids, and an id already emitted is never emitted again. A node
event showing the node back in service after DRAIN/DOWN (an operator resume) closes every
episode; repeat-offender history then counts only jobs confirmed after the resume.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from peerwatch.schemas.records import (
    DrainRecommendation,
    Evidence,
    HealthCheckResult,
    NodeStateEvent,
    RecommendedAction,
    Severity,
    StragglerFinding,
)
from peerwatch.streams.core.model import (
    CLEARED,
    CONFIRMED,
    FLEET_WIDE,
    HARD_ERROR,
    JOB_WIDE,
    SILENT,
    SUSPECT,
    InvalidRecordError,
    require,
)
from peerwatch.streams.core.policy_state import (
    DrainPolicyState,
    Episode,
    NodePolicyState,
    RepeatEntry,
    StragglerTrack,
)
from peerwatch.streams.core.recommendations import (
    emit,
    feature_summary,
    hw_evidence,
)
from peerwatch.streams.core.settings import PolicySettings

__all__ = [
    "DEFAULT_POLICY",
    "apply",
    "apply_finding",
    "apply_health",
    "apply_node_event",
    "record_kind",
]

DEFAULT_POLICY = PolicySettings()
_OUT_OF_SERVICE_FLAGS = {"DRAIN", "DRAINED", "DRAINING", "DOWN", "FAIL"}


def record_kind(record: Mapping[str, object]) -> str:
    """``"finding"``, ``"health"`` or ``"node_event"``; raises InvalidRecordError otherwise."""
    if "finding_id" in record:
        return "finding"
    if "checks" in record or ("exit_code" in record and "phase" in record):
        return "health"
    if "flags" in record or ("state" in record and "event_id" in record):
        return "node_event"
    raise InvalidRecordError(
        "record is neither a StragglerFinding, HealthCheckResult nor NodeStateEvent"
    )


def apply(
    record: Mapping[str, Any],
    state: DrainPolicyState,
    settings: PolicySettings = DEFAULT_POLICY,
) -> list[DrainRecommendation]:
    """Feed one StragglerFinding, HealthCheckResult or NodeStateEvent dict to the policy.

    Updates ``state`` in place; returns the new DrainRecommendation dicts (often none). Times
    are int ms (UTC) from the record. Raises InvalidRecordError for a record of another kind or
    one lacking a key field.
    """
    # Any decoded record: its kind (hence its type) is told from its fields, here.
    kind = record_kind(record)
    if kind == "finding":
        return apply_finding(cast(StragglerFinding, record), state, settings)
    if kind == "health":
        return apply_health(cast(HealthCheckResult, record), state, settings)
    return apply_node_event(cast(NodeStateEvent, record), state, settings)


def apply_finding(
    finding: StragglerFinding, state: DrainPolicyState, settings: PolicySettings = DEFAULT_POLICY
) -> list[DrainRecommendation]:
    """Handle one StragglerFinding dict (see :func:`apply`)."""
    require(
        finding,
        "finding_id",
        "job_id",
        "status",
        "window_start_ms",
        "window_end_ms",
        what="StragglerFinding",
    )
    status = finding["status"]
    node = finding.get("node")
    if node is None:
        return []  # job-level event: there is no node to recommend anything for
    ns = state.node(str(node))
    ts_ms = int(finding["window_end_ms"])
    detected = finding.get("detected_ms")
    if status in (HARD_ERROR, SILENT) and detected is not None:
        ts_ms = int(detected)  # hard rules on arrival, silence: the evidence's own time
    _prune(ns, ts_ms, settings)
    if status == HARD_ERROR:
        return _hard_error(ns, finding, ts_ms, settings)
    if status == SILENT:
        return _silent(ns, finding, ts_ms, settings)
    if status == FLEET_WIDE or finding.get("cause") == "NO_SAMPLES":
        return []  # fleet-wide events name no node; a silence's CLEARED needs no action
    if status == JOB_WIDE:
        return emit(
            ns,
            settings,
            cause="job_wide",
            episode=(finding["job_id"], finding["window_start_ms"]),
            ts_ms=ts_ms,
            action="ALERT",
            severity="INFO",
            reason=f"job-wide slowdown job {finding['job_id']}, no GPU blamed",
            finding=finding,
            evidence_kind="job_wide",
            expiry_s=settings.alert_expiry_s,
        )
    gpu_index = finding.get("gpu_index")
    if gpu_index is None and finding.get("port") is not None:
        return _port_alert(ns, finding, ts_ms, settings)
    if gpu_index is None:
        raise InvalidRecordError("StragglerFinding record lacks 'gpu_index'")
    gpu = int(gpu_index)
    first = finding.get("first_flagged_ms")
    first_ms = int(first if first is not None else finding["window_start_ms"])
    episode = (finding["job_id"], gpu, first_ms)
    key = f"{finding['job_id']}/{gpu}"
    if status == SUSPECT:
        if not settings.alert_on_suspect:
            return []
        reason = f"suspect gpu{gpu} job {finding['job_id']}: {feature_summary(finding, settings)}"
        return emit(
            ns,
            settings,
            cause="suspect",
            episode=episode,
            ts_ms=ts_ms,
            action="ALERT",
            severity="INFO",
            reason=reason,
            finding=finding,
            evidence_kind="straggler",
            expiry_s=settings.alert_expiry_s,
        )
    if status == CLEARED:
        track = ns.stragglers.get(key)
        if track is not None and track.first_flagged_ms == first_ms:
            del ns.stragglers[key]
        return []
    if status != CONFIRMED:
        return []
    return _confirmed(ns, finding, key, gpu, first_ms, ts_ms, settings)


def _confirmed(
    ns: NodePolicyState,
    finding: StragglerFinding,
    key: str,
    gpu: int,
    first_ms: int,
    ts_ms: int,
    settings: PolicySettings,
) -> list[DrainRecommendation]:
    job = str(finding["job_id"])
    episode = (job, gpu, first_ms)
    hw = hw_evidence(finding, settings)
    summary = feature_summary(finding, settings)
    out: list[DrainRecommendation] = []
    track = ns.stragglers.get(key)
    if track is None or track.first_flagged_ms != first_ms:
        track = StragglerTrack(job, gpu, first_ms, ts_ms, ts_ms, hw, finding["finding_id"], summary)
        ns.stragglers[key] = track
        if settings.alert_on_confirmed:
            reason = f"straggler confirmed gpu{gpu} job {job}: {summary}"
            severity: Severity = "WARNING" if hw else "INFO"
            out += emit(
                ns,
                settings,
                cause="confirmed",
                episode=episode,
                ts_ms=ts_ms,
                action="ALERT",
                severity=severity,
                reason=reason,
                finding=finding,
                evidence_kind="straggler",
                expiry_s=settings.alert_expiry_s,
            )
    else:
        track.last_ms = max(track.last_ms, ts_ms)
        if hw:
            track.hw_evidence = True
            track.finding_id, track.detail = finding["finding_id"], summary
    lasted_ms = ts_ms - track.confirmed_ms
    if track.hw_evidence and lasted_ms >= settings.drain_after_confirmed_s * 1000:
        reason = f"straggler gpu{gpu} job {job}: {track.detail} for {lasted_ms // 60000}m"
        out += emit(
            ns,
            settings,
            cause="straggler",
            episode=episode,
            ts_ms=ts_ms,
            action="DRAIN",
            severity="WARNING",
            reason=reason,
            finding=finding,
            evidence_kind="straggler",
            expiry_s=settings.drain_expiry_s,
        )
    if hw:
        out += _repeat_offender(ns, finding, job, gpu, ts_ms, summary, settings)
    return out


def _repeat_offender(
    ns: NodePolicyState,
    finding: StragglerFinding,
    job: str,
    gpu: int,
    ts_ms: int,
    summary: str,
    settings: PolicySettings,
) -> list[DrainRecommendation]:
    is_new = job not in ns.repeat
    ns.repeat[job] = RepeatEntry(job, gpu, ts_ms, finding["finding_id"], summary)
    if not is_new or len(ns.repeat) < settings.repeat_offender_jobs:
        return []
    jobs = sorted(ns.repeat)
    days = settings.repeat_offender_window_s / 86400
    reason = f"repeat offender: straggler in {len(jobs)} jobs in {days:g}d ({' '.join(jobs)})"
    evidence: list[Evidence] = [
        {
            "kind": "repeat_offender",
            "detail": f"gpu{e.gpu_index} job {e.job_id}: {e.detail}",
            "finding_id": e.finding_id,
            "job_id": e.job_id,
            "gpu_index": e.gpu_index,
        }
        for e in (ns.repeat[j] for j in jobs)
    ]
    return emit(
        ns,
        settings,
        cause="repeat_offender",
        episode=(job,),
        ts_ms=ts_ms,
        action="DRAIN",
        severity="WARNING",
        reason=reason,
        finding=finding,
        evidence_kind="repeat_offender",
        expiry_s=settings.drain_expiry_s,
        evidence=evidence,
    )


def _silent(
    ns: NodePolicyState, finding: StragglerFinding, ts_ms: int, settings: PolicySettings
) -> list[DrainRecommendation]:
    """A node's samples stopped while its GPUs are allocated: ALERT (WARNING) by default, a
    DRAIN (WARNING, not hard) only with ``policy.drain_on_silent``. One per silence episode."""
    since = finding.get("first_flagged_ms")
    episode = (int(since if since is not None else finding["window_start_ms"]),)
    reason = f"silent: {finding.get('reason') or 'no samples'}"
    drain = settings.drain_on_silent
    if not drain and not settings.alert_on_silent:
        return []
    return emit(
        ns,
        settings,
        cause="silent_drain" if drain else "silent",
        episode=episode,
        ts_ms=ts_ms,
        action="DRAIN" if drain else "ALERT",
        severity="WARNING",
        reason=reason,
        finding=finding,
        evidence_kind="silent",
        expiry_s=settings.drain_expiry_s if drain else settings.alert_expiry_s,
        gpus=[],
    )


def _port_alert(
    ns: NodePolicyState, finding: StragglerFinding, ts_ms: int, settings: PolicySettings
) -> list[DrainRecommendation]:
    """A non-hard finding that blames a NIC port, not a GPU (a port below its rated speed, a
    port that stands out inside its job): an ALERT naming the port, never a drain."""
    if finding["status"] not in (SUSPECT, CONFIRMED):
        return []
    port = str(finding.get("port"))
    first = finding.get("first_flagged_ms")
    first_ms = int(first if first is not None else finding["window_start_ms"])
    return emit(
        ns,
        settings,
        cause="network",
        episode=(finding["job_id"], port, first_ms),
        ts_ms=ts_ms,
        action="ALERT",
        severity="WARNING",
        reason=f"network port {port} job {finding['job_id']}: {finding['reason']}",
        finding=finding,
        evidence_kind="network",
        expiry_s=settings.alert_expiry_s,
        gpus=[],
    )


def _hard_error(
    ns: NodePolicyState, finding: StragglerFinding, ts_ms: int, settings: PolicySettings
) -> list[DrainRecommendation]:
    episode = ns.episodes.get("hard")
    if episode is not None and ts_ms < episode.expires_ms:
        return []
    start_ms = int(finding["window_start_ms"])
    rules = " ".join(finding.get("hard_rules") or []) or "hard rule"
    port = finding.get("port")
    where = f"port {port}" if port is not None else f"gpu{finding.get('gpu_index')}"
    reason = f"hard error {where}: {rules}"
    out = emit(
        ns,
        settings,
        cause="hard",
        episode=(start_ms,),
        ts_ms=ts_ms,
        action="DRAIN",
        severity="CRITICAL",
        hard=True,
        reason=reason,
        finding=finding,
        evidence_kind="hard_rule",
        expiry_s=settings.hard_expiry_s,
    )
    ns.episodes["hard"] = Episode(start_ms, ts_ms + settings.hard_expiry_s * 1000)
    return out


def apply_health(
    result: HealthCheckResult, state: DrainPolicyState, settings: PolicySettings = DEFAULT_POLICY
) -> list[DrainRecommendation]:
    """Handle one HealthCheckResult dict: CRITICAL drains (hard), WARNING alerts, OK closes."""
    require(result, "node", "ts_ms", what="HealthCheckResult")
    ns = state.node(str(result["node"]))
    ts_ms = int(result["ts_ms"])
    _prune(ns, ts_ms, settings)
    status = result.get("status")
    if status == "OK":
        ns.episodes.pop("health", None)
        ns.episodes.pop("health_warning", None)
        return []
    action: RecommendedAction
    severity: Severity
    if status == "CRITICAL":
        cause, action, severity, hard, expiry_s = (
            "health",
            "DRAIN",
            "CRITICAL",
            True,
            settings.hard_expiry_s,
        )
    elif status == "WARNING" and settings.alert_on_health_warning:
        cause, action, severity, hard, expiry_s = (
            "health_warning",
            "ALERT",
            "WARNING",
            False,
            settings.alert_expiry_s,
        )
    else:
        return []
    episode = ns.episodes.get(cause)
    if episode is not None and ts_ms < episode.expires_ms:
        return []
    failing = [c for c in result.get("checks") or [] if c.get("status") == status]
    names = (
        ",".join(sorted({str(c.get("name")) for c in failing})) or f"exit {result.get('exit_code')}"
    )
    evidence: list[Evidence] = [
        {
            "kind": "health_check",
            "detail": f"{c.get('name')}: {c.get('message')}",
            "finding_id": None,
            "job_id": result.get("job_id"),
            "gpu_index": c.get("gpu_index"),
        }
        for c in failing
    ]
    gpus = sorted({int(g) for c in failing if (g := c.get("gpu_index")) is not None})
    jobs = [str(result["job_id"])] if result.get("job_id") else []
    out = emit(
        ns,
        settings,
        cause=cause,
        episode=(ts_ms,),
        ts_ms=ts_ms,
        action=action,
        severity=severity,
        hard=hard,
        reason=f"health {status}: {names}",
        finding=None,
        evidence_kind="health_check",
        expiry_s=expiry_s,
        evidence=evidence,
        gpus=gpus,
        jobs=jobs,
    )
    ns.episodes[cause] = Episode(ts_ms, ts_ms + expiry_s * 1000)
    return out


def apply_node_event(
    event: NodeStateEvent, state: DrainPolicyState, settings: PolicySettings = DEFAULT_POLICY
) -> list[DrainRecommendation]:
    """Handle one NodeStateEvent dict: remember the partition and notice operator resumes.

    Never recommends anything itself.
    """
    require(event, "node", "ts_ms", what="NodeStateEvent")
    ns = state.node(str(event["node"]))
    ts_ms = int(event["ts_ms"])
    _prune(ns, ts_ms, settings)
    partitions = event.get("partitions") or []
    if partitions:
        ns.partition = str(partitions[0])
    flags = {str(f).upper() for f in event.get("flags") or []}
    base = str(event.get("state") or "").upper()
    out_of_service = bool(flags & _OUT_OF_SERVICE_FLAGS) or base in _OUT_OF_SERVICE_FLAGS
    if ns.out_of_service and not out_of_service:
        ns.resumed_ms = ts_ms
        ns.episodes.clear()
        ns.stragglers.clear()
        ns.repeat.clear()
    ns.out_of_service = out_of_service
    return []


def _prune(ns: NodePolicyState, ts_ms: int, settings: PolicySettings) -> None:
    """Forget what can no longer matter, so node state stays small."""
    horizon_ms = settings.repeat_offender_window_s * 1000
    ns.emitted = {k: v for k, v in ns.emitted.items() if v + horizon_ms >= ts_ms}
    ns.repeat = {k: e for k, e in ns.repeat.items() if ts_ms - e.last_ms <= horizon_ms}
    ns.stragglers = {k: t for k, t in ns.stragglers.items() if ts_ms - t.last_ms <= horizon_ms}
    ns.episodes = {k: e for k, e in ns.episodes.items() if e.expires_ms + horizon_ms >= ts_ms}
