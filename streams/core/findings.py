"""Building StragglerFinding dicts: deterministic ids, evidence and short reasons."""

from __future__ import annotations

from peerwatch.schemas.records import (
    FeatureEvidence,
    FindingCause,
    FindingStatus,
    GpuWindow,
    StragglerFinding,
)
from peerwatch.streams.core.detector_state import GpuDetectorState
from peerwatch.streams.core.hard_rules import hard_cause
from peerwatch.streams.core.model import CLEARED, JOB_WIDE, SUSPECT, stable_id
from peerwatch.streams.core.peers import GpuVerdict
from peerwatch.streams.core.settings import DetectorSettings


def straggler_reason(status: str, verdict: GpuVerdict, gpu_state: GpuDetectorState) -> str:
    """``suspect slow vs peers: clk -5.6% z=-3.8; 1/1 windows`` and the like."""
    if status == CLEARED:
        return f"clean for {gpu_state.clean_streak} windows"
    against = "own baseline" if verdict.baseline else "peers"
    parts = []
    for ev in verdict.evidence:
        if ev["feature"] in verdict.flags:
            parts.append(describe_feature(ev))
    label = "suspect" if status == SUSPECT else "confirmed"
    flagged = f"{flagged_windows(gpu_state)}/{len(gpu_state.history)} windows"
    return f"{label} slow vs {against}: {', '.join(parts)}; {flagged}"


def flagged_windows(gpu_state: GpuDetectorState) -> int:
    """Windows of the GPU's recent history flagged by any feature."""
    return sum(1 for code in gpu_state.history if code)


def describe_feature(ev: FeatureEvidence) -> str:
    """``clk -5.6% z=-3.8``: relative for ratios of a scale, absolute for shares."""
    value, mid = ev["value"], ev["peer_median"]
    if ev["feature"] in ("clk", "step") and mid:
        delta = f"{100.0 * (value - mid) / mid:+.1f}%"
    else:
        delta = f"{value - mid:+.2f}"
    return f"{ev['feature']} {delta} z={ev['z']:.1f}"


def job_wide_finding(
    job_id: str,
    start_ms: int,
    end_ms: int,
    group_n: int,
    slow_n: int,
    reason: str,
    hex_chars: int,
    cause: FindingCause = "UNKNOWN",
) -> StragglerFinding:
    """A JOB_WIDE finding (no node, no GPU): ``windows_flagged`` holds the slow GPUs' count."""
    return {
        "finding_id": stable_id(job_id, None, None, JOB_WIDE, start_ms, hex_chars=hex_chars),
        "job_id": job_id,
        "node": None,
        "gpu_index": None,
        "gpu_uuid": None,
        "status": JOB_WIDE,
        "window_start_ms": start_ms,
        "window_end_ms": end_ms,
        "features": [],
        "hard_rules": [],
        "windows_flagged": slow_n,
        "windows_considered": group_n,
        "first_flagged_ms": start_ms,
        "peer_group_size": group_n,
        "reason": reason,
        "cause": cause,
        # A window-based verdict has its evidence when the window's last moment has been seen.
        "detected_ms": end_ms,
        "port": None,
        "switch": None,
    }


def make_finding(
    job_id: str,
    status: FindingStatus,
    window: GpuWindow,
    features: list[FeatureEvidence],
    rules: list[str],
    gpu_state: GpuDetectorState | None,
    group_n: int,
    reason: str,
    settings: DetectorSettings,
    cause: FindingCause | None = None,
    detected_ms: int | None = None,
) -> StragglerFinding:
    """A per-GPU finding; the id hashes job, node, GPU, status and window start.

    ``cause``: the named cause (default: from the hard rules, else UNKNOWN); ``detected_ms``:
    the event time the detector had its evidence (default: the window's end, when a window-based
    verdict's evidence is complete; a rule fired by one sample passes that sample's time).
    """
    start_ms = int(window["window_start_ms"])
    history = gpu_state.history if gpu_state is not None else []
    return {
        "finding_id": stable_id(
            job_id,
            window["node"],
            window["gpu_index"],
            status,
            start_ms,
            hex_chars=settings.id_hex_chars,
        ),
        "job_id": job_id,
        "node": str(window["node"]),
        "gpu_index": int(window["gpu_index"]),
        "gpu_uuid": window.get("gpu_uuid"),
        "status": status,
        "window_start_ms": start_ms,
        "window_end_ms": int(window["window_end_ms"]),
        "features": [FeatureEvidence(**f) for f in features],
        "hard_rules": list(rules),
        "windows_flagged": sum(1 for code in history if code),
        "windows_considered": len(history),
        "first_flagged_ms": gpu_state.episode_start_ms if gpu_state is not None else None,
        "peer_group_size": group_n,
        "reason": reason,
        "cause": cause if cause is not None else hard_cause(rules) if rules else "UNKNOWN",
        "detected_ms": int(window["window_end_ms"]) if detected_ms is None else detected_ms,
        "port": None,
        "switch": None,
    }
