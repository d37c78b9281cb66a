"""Building DrainRecommendation dicts: ids, evidence, reasons fit for ``scontrol ... Reason=``."""

from __future__ import annotations

from collections.abc import Sequence

from peerwatch.reasons import sanitize_reason
from peerwatch.schemas.records import (
    DrainRecommendation,
    Evidence,
    RecommendedAction,
    Severity,
    StragglerFinding,
)
from peerwatch.streams.core.model import is_idle_job, stable_id
from peerwatch.streams.core.policy_state import NodePolicyState
from peerwatch.streams.core.settings import PolicySettings


def hw_evidence(finding: StragglerFinding, settings: PolicySettings) -> bool:
    """Clock at least evidence_clk_rel below, or throttle evidence_thr above, the comparison."""
    for ev in finding.get("features") or []:
        value, mid = float(ev["value"]), float(ev["peer_median"])
        if ev["feature"] == "clk" and mid > 0 and mid - value >= settings.evidence_clk_rel * mid:
            return True
        if ev["feature"] == "thr" and value - mid >= settings.evidence_thr:
            return True
    return False


def feature_summary(finding: StragglerFinding, settings: PolicySettings) -> str:
    """``clk -5.6% z=-3.8 thr +0.30 z=10.1``: the features with |z| >= evidence_z."""
    parts = []
    for ev in finding.get("features") or []:
        name, value, mid, z = ev["feature"], float(ev["value"]), float(ev["peer_median"]), ev["z"]
        if name == "power" or abs(z) < settings.evidence_z:
            continue
        delta = (
            f"{100 * (value - mid) / mid:+.1f}%"
            if name in ("clk", "step") and mid
            else f"{value - mid:+.2f}"
        )
        parts.append(f"{name} {delta} z={z:.1f}")
    return " ".join(parts) or "no feature evidence"


def emit(
    ns: NodePolicyState,
    settings: PolicySettings,
    *,
    cause: str,
    episode: Sequence[object],
    ts_ms: int,
    action: RecommendedAction,
    severity: Severity,
    reason: str,
    evidence_kind: str,
    expiry_s: int,
    hard: bool = False,
    finding: StragglerFinding | None = None,
    evidence: list[Evidence] | None = None,
    gpus: list[int] | None = None,
    jobs: list[str] | None = None,
) -> list[DrainRecommendation]:
    """One recommendation, or none when its id (node, cause, episode) was already emitted.

    ``ts_ms`` is the event time of the evidence; ``expires_ms`` = ts_ms + expiry_s.
    """
    rec_id = stable_id(ns.node, cause, *episode, hex_chars=settings.id_hex_chars)
    if rec_id in ns.emitted:
        return []
    expires_ms = ts_ms + expiry_s * 1000
    ns.emitted[rec_id] = expires_ms
    if finding is not None:
        gpu = finding.get("gpu_index")
        if evidence is None:
            detail = finding.get("reason") or feature_summary(finding, settings)
            evidence = [
                {
                    "kind": evidence_kind,
                    "detail": str(detail),
                    "finding_id": finding["finding_id"],
                    "job_id": None if is_idle_job(finding["job_id"]) else finding["job_id"],
                    "gpu_index": gpu,
                }
            ]
        if gpus is None:
            gpus = sorted({int(g) for e in evidence if (g := e.get("gpu_index")) is not None})
        if jobs is None:
            jobs = sorted(
                {
                    str(j)
                    for e in evidence
                    if (j := e.get("job_id")) is not None and not is_idle_job(str(j))
                }
            )
    return [
        {
            "recommendation_id": rec_id,
            "node": ns.node,
            "ts_ms": ts_ms,
            "action": action,
            "severity": severity,
            "hard": hard,
            "reason": sanitize_reason(reason, settings.reason_max_chars),
            "gpu_indices": gpus or [],
            "job_ids": jobs or [],
            "partition": ns.partition,
            "evidence": evidence or [],
            "expires_ms": expires_ms,
            "cause": finding.get("cause", "UNKNOWN") if finding is not None else "UNKNOWN",
            "port": finding.get("port") if finding is not None else None,
        }
    ]
