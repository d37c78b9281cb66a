"""What ``peerwatch demo`` shows: a pure view model fed with decoded output records.

The demo's terminal view and its closing summary are functions of the records the pipeline
published (job events, straggler findings, drain recommendations) and of the simulator's ground
truth labels; nothing here touches Kafka or the terminal.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: Finding statuses that flag a GPU (JOB_WIDE and CLEARED do not).
FLAGGING = ("SUSPECT", "CONFIRMED", "HARD_ERROR")


@dataclass
class Flag:
    """The latest verdict on one GPU."""

    node: str
    gpu_index: int | None
    job_id: str
    status: str
    reason: str
    evidence: str
    cause: str
    window_end_ms: int


@dataclass
class DemoView:
    """Accumulates the pipeline's outputs; renders the live view and the summary."""

    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    flags: dict[tuple[str, int | None], Flag] = field(default_factory=dict)
    recommendations: list[dict[str, Any]] = field(default_factory=list)
    windows: int = 0
    samples_published: int = 0
    event_time_ms: int = 0

    def on_job_event(self, event: Mapping[str, Any]) -> None:
        nodes = [a["node"] for a in event.get("allocations") or []]
        gpus = sum(len(a.get("gpu_indices") or []) for a in event.get("allocations") or [])
        job = self.jobs.setdefault(str(event["job_id"]), {"gpus": 0, "nodes": 0})
        job.update(kind=event.get("kind"), user=event.get("user"), name=event.get("job_name"))
        if event.get("kind") == "STARTED":
            job.update(gpus=gpus, nodes=len(nodes))

    def on_finding(self, finding: Mapping[str, Any]) -> None:
        status = str(finding.get("status"))
        key = (str(finding.get("node") or "-"), finding.get("gpu_index"))
        if status == "CLEARED":
            if key in self.flags:  # keep the evidence: it was flagged, and now it is healthy again
                self.flags[key].status = "CLEARED"
            return
        if status not in FLAGGING:
            return
        job_id = str(finding.get("job_id"))
        current = self.flags.get(key)
        if (
            current is not None
            and job_id.startswith("idle:")
            and not current.job_id.startswith("idle:")
        ):
            return  # the GPU stayed broken after its job ended: keep the job's own finding
        self.flags[key] = Flag(
            node=key[0],
            gpu_index=key[1],
            job_id=str(finding.get("job_id")),
            status=status,
            reason=str(finding.get("reason", "")),
            evidence=evidence_text(finding),
            cause=str(finding.get("cause") or "UNKNOWN").lower(),
            window_end_ms=int(finding.get("window_end_ms") or 0),
        )

    def on_recommendation(self, rec: Mapping[str, Any]) -> None:
        self.recommendations.append(dict(rec))

    # -- rendering ----------------------------------------------------------------------------------
    def render(self, width: int = 110) -> str:
        lines = [
            f"peerwatch demo — event time {fmt_time(self.event_time_ms)}   "
            f"samples published {self.samples_published:,}   GPU windows analysed {self.windows:,}",
            "",
            f"{'job':>8} {'GPUs':>5} {'nodes':>5}  {'user':10} {'name':16} state",
        ]
        for job_id, job in sorted(self.jobs.items(), key=lambda kv: -int(kv[1].get("gpus") or 0)):
            lines.append(
                f"{job_id:>8} {job.get('gpus', 0):>5} {job.get('nodes', 0):>5}  "
                f"{job.get('user') or '-'!s:10.10} {job.get('name') or '-'!s:16.16} "
                f"{job.get('kind') or '-'}"
            )
        active = sum(f.status != "CLEARED" for f in self.flags.values())
        lines += ["", f"flagged GPUs ({active} now, {len(self.flags)} in all)"]
        for flag in sorted(self.flags.values(), key=lambda f: (f.node, f.gpu_index or -1)):
            gpu = "-" if flag.gpu_index is None else str(flag.gpu_index)
            lines.append(
                f"  {flag.status:10} {flag.node} gpu{gpu} job {flag.job_id} [{flag.cause}]: "
                f"{flag.evidence}"[:width]
            )
        lines += ["", f"drain recommendations ({len(self.recommendations)})"]
        for rec in self.recommendations[-12:]:
            lines.append(
                f"  {rec.get('action'):5} {rec.get('severity'):8} {rec.get('node')} "
                f"[{str(rec.get('cause') or 'UNKNOWN').lower()}]: {rec.get('reason')}"[:width]
            )
        return "\n".join(lines)

    def summary(self, labels: Iterable[Mapping[str, Any]]) -> tuple[str, bool]:
        """Injected faults vs what was found: (text, everything expected and nothing else)."""
        ok = True
        lines = ["", "summary: injected faults and what peerwatch said"]
        flagged_nodes = {f.node for f in self.flags.values()} | {
            str(r.get("node")) for r in self.recommendations
        }
        expected_nodes: set[str] = set()
        for label in labels:
            if label.get("kind") != "fault" or label.get("expect") == "nothing":
                continue
            node, gpu = str(label.get("node")), label.get("gpu_index")
            expected_nodes.add(node)
            flag = self.flags.get((node, gpu))  # flagged at some point (maybe cleared since)
            drains = [
                r
                for r in self.recommendations
                if r.get("node") == node and r.get("action") == "DRAIN"
            ]
            found = flag is not None or bool(drains)
            verdict = "FOUND" if found else "MISSED"
            ok &= found
            detail = flag.evidence if flag else (drains[0].get("reason") if drains else "")
            drain_note = f", DRAIN recommended ({drains[0].get('severity')})" if drains else ""
            lines.append(
                f"  {verdict:6} {label.get('name')} on {node} gpu{gpu} (job {label.get('job_id')})"
                f"{drain_note}: {detail}"
            )
        extra = sorted(flagged_nodes - expected_nodes)
        for node in extra:
            ok = False
            lines.append(f"  EXTRA  {node} was flagged without an injected fault")
        lines.append(
            "  result: every injected fault found, nothing else flagged"
            if ok
            else "  result: NOT as expected (see above)"
        )
        return "\n".join(lines), ok


def evidence_text(finding: Mapping[str, Any]) -> str:
    """A short line of evidence: features with value vs peer median and z, or the hard rules."""
    parts = []
    for ev in finding.get("features") or []:
        if abs(float(ev.get("z") or 0.0)) < 3.5:
            continue
        parts.append(
            f"{ev['feature']} {float(ev['value']):.3f} vs peers {float(ev['peer_median']):.3f} "
            f"(z={float(ev['z']):+.1f})"
        )
    rules = finding.get("hard_rules") or []
    if rules:
        parts.append("hard: " + ", ".join(map(str, rules)))
    flagged, considered = finding.get("windows_flagged"), finding.get("windows_considered")
    if considered:
        parts.append(f"{flagged}/{considered} windows")
    return "; ".join(parts) or str(finding.get("reason", ""))


def fmt_time(ts_ms: int) -> str:
    if not ts_ms:
        return "-"
    return dt.datetime.fromtimestamp(ts_ms / 1000, tz=dt.UTC).strftime("%H:%M:%S")
