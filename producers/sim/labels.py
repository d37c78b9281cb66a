"""Ground truth for a scenario: one label per injected fault and confounder.

A label is a JSON-ready dict::

    {"kind": "fault" | "confounder", "name": str, "node": str | None, "gpu_index": int | None,
     "job_id": str | None, "start_ms": int, "end_ms": int, "expect": "straggler" | "drain" |
     "silent" | "nothing", "params": {...}}

``job_id`` is the job that owned the GPU (any GPU of the node when ``gpu_index`` is None) at onset;
times are epoch ms on the true clock. What the detector should conclude (DETECTION.md):

- clock faults (``sm_clock_drop`` of >= 5%, ``thermal_throttle``, ``power_brake``) on a GPU of a
  job with >= 8 GPUs: ``straggler``, or ``drain`` when they overlap the job for >= 10 minutes;
  elsewhere (idle GPU, small job, a drop under 5%): ``nothing``;
- hard errors (hardware XIDs, NVLink storm, PCIe downtrain, GPU lost): ``drain``; application XIDs
  (13, 31, 43, 45, 68) and unknown codes: ``nothing``;
- ``agent_silent`` (a node's samples stop): ``silent`` while a job owns the node, else
  ``nothing`` (an idle node is not watched);
- every confounder: ``nothing``.
"""

from __future__ import annotations

from typing import Any

from peerwatch.producers.sim.scenario import Injection, Scenario
from peerwatch.producers.sim.scheduler import Schedule

HARD_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95})
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68})
CLOCK_FAULTS = frozenset({"sm_clock_drop", "thermal_throttle", "power_brake"})
HARD_FAULTS = frozenset({"nvlink_error_storm", "pcie_downtrain", "gpu_lost"})
MIN_PEER_GROUP = 8
MIN_STRAGGLER_DROP_PCT = 5.0
DRAIN_AFTER_MS = 10 * 60 * 1000


def _expect(inj: Injection, job_gpus: int, overlap_ms: int) -> str:
    if inj.kind == "confounder":
        return "nothing"
    if inj.name == "agent_silent":
        return "silent" if overlap_ms > 0 else "nothing"
    if inj.name in HARD_FAULTS:
        return "drain"
    if inj.name == "xid":
        return "drain" if int(inj.param("xid", 79)) in HARD_XIDS else "nothing"
    if inj.name in CLOCK_FAULTS:
        if inj.name == "sm_clock_drop" and inj.param("pct", 8.0) < MIN_STRAGGLER_DROP_PCT:
            return "nothing"
        if job_gpus < MIN_PEER_GROUP or overlap_ms <= 0:
            return "nothing"
        return "drain" if overlap_ms >= DRAIN_AFTER_MS else "straggler"
    return "nothing"


def build_labels(scenario: Scenario, schedule: Schedule) -> list[dict[str, Any]]:
    """One label per fault and confounder of ``scenario``, in scenario order (faults first)."""
    fleet = scenario.fleet
    horizon_ms = fleet.duration_ms
    out: list[dict[str, Any]] = []
    for inj in scenario.injections:
        start = round(inj.start_s * 1000)
        end = min(round(inj.end_s * 1000), horizon_ms) if inj.end_s is not None else horizon_ms
        run = None
        if "job_id" in inj.params:
            wanted = str(inj.params["job_id"])
            run = next(
                (r for r in schedule.runs if r.job.job_id == wanted and r.covers(start)), None
            )
        elif inj.node is not None:
            # A requeue ends the run at its onset, so look just before it.
            at = max(0, start - 1) if inj.name == "requeue" else start
            run = schedule.owner_at(inj.node, inj.gpu_index, at)
        overlap = 0
        if run is not None:
            run_end = run.end_ms if run.end_ms is not None else horizon_ms
            overlap = min(end, run_end) - max(start, run.start_ms)
        out.append(
            {
                "kind": inj.kind,
                "name": inj.name,
                "node": fleet.node_name(inj.node) if inj.node is not None else None,
                "gpu_index": inj.gpu_index,
                "job_id": run.job.job_id if run is not None else None,
                "start_ms": fleet.start_ms + start,
                "end_ms": fleet.start_ms + end,
                "expect": _expect(inj, run.gpus if run else 0, overlap),
                "params": dict(inj.params),
            }
        )
    return out
