"""What ``peerwatch demo`` shows: a pure view model fed with decoded output records.

The demo's terminal view (rich tables, drawn by the command in a ``rich.live.Live`` on the
alternate screen) and its closing summary are functions of the records the pipeline published
(job events, straggler findings, drain recommendations) and of the simulator's ground truth
labels; nothing here touches Kafka or the terminal. Text from the records (job and user names,
nodes, causes) is shown through :func:`peerwatch.console.user_text`: escaped and capped.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group
from rich.text import Text

from peerwatch.console import render, table, user_text
from peerwatch.display import TEXT_MAX_CHARS, display_text
from peerwatch.streams.core.slowdown import lead_feature, slowdown, slowdown_text

#: Findings kept per flagged GPU for its slowdown (the demo runs minutes: a bound, not a window).
_FINDINGS_KEPT = 500

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
    #: The NIC port a network finding names (it names no GPU); None for a GPU's finding.
    port: str | None = None
    #: The GPU's flagging findings (the newest :data:`_FINDINGS_KEPT`), for its slowdown.
    findings: list[Mapping[str, Any]] = field(default_factory=list)

    @property
    def slowdown_text(self) -> str:
        """The GPU's slowdown (:mod:`peerwatch.streams.core.slowdown`), ``""`` without one."""
        feature = lead_feature(e for f in self.findings for e in f.get("features") or [])
        if feature is None:
            return ""
        return slowdown_text(feature, slowdown(self.findings, feature))


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
        kept = [*current.findings[-_FINDINGS_KEPT + 1 :], finding] if current else [finding]
        self.flags[key] = Flag(
            findings=kept,
            node=key[0],
            gpu_index=key[1],
            job_id=str(finding.get("job_id")),
            status=status,
            reason=str(finding.get("reason", "")),
            evidence=evidence_text(finding),
            cause=str(finding.get("cause") or "UNKNOWN").lower(),
            window_end_ms=int(finding.get("window_end_ms") or 0),
            port=str(finding["port"]) if finding.get("port") else None,
        )

    def on_recommendation(self, rec: Mapping[str, Any]) -> None:
        self.recommendations.append(dict(rec))

    # -- rendering ----------------------------------------------------------------------------------
    def renderable(self) -> Group:
        """The live view: a status line, the jobs, the flagged GPUs with their slowdown and
        evidence, the latest drain recommendations; tables fit the console's width."""
        head = Text(
            f"peerwatch demo — event time {fmt_time(self.event_time_ms)}   samples published "
            f"{self.samples_published:,}   GPU windows analysed {self.windows:,}",
            style="bold",
        )
        jobs = table("job", "GPUs", "nodes", "user", "name", "state", right=(1, 2))
        for job_id, job in sorted(self.jobs.items(), key=lambda kv: -int(kv[1].get("gpus") or 0)):
            jobs.add_row(user_text(job_id, 20), str(job.get("gpus", 0)),
                         str(job.get("nodes", 0)), user_text(job.get("user") or "-", 16),
                         user_text(job.get("name") or "-", 24), user_text(job.get("kind") or "-", 12))  # fmt: skip
        active = sum(f.status != "CLEARED" for f in self.flags.values())
        flags = table("status", "node", "GPU/port", "job", "cause", "slowdown", "evidence",
                      title=f"flagged GPUs and ports ({active} now, {len(self.flags)} in all)")  # fmt: skip
        for flag in sorted(self.flags.values(), key=lambda f: (f.node, f.gpu_index or -1)):
            flags.add_row(
                Text(flag.status, style="green" if flag.status == "CLEARED" else "red"),
                user_text(flag.node, 24), _where(flag.gpu_index, flag.port),
                user_text(flag.job_id, 20), user_text(flag.cause, 16),
                flag.slowdown_text or "-", user_text(flag.evidence, 160),
            )  # fmt: skip
        recs = table("action", "severity", "node", "GPUs/port", "cause", "slowdown",
                     title=f"drain recommendations ({len(self.recommendations)}; the latest 12)")  # fmt: skip
        for rec in self.recommendations[-12:]:
            node = str(rec.get("node"))
            gpus = [g for g in rec.get("gpu_indices") or [] if isinstance(g, int)]
            slow = [f.slowdown_text for (n, g), f in self.flags.items() if n == node and g in gpus]
            recs.add_row(
                user_text(rec.get("action"), 8), user_text(rec.get("severity"), 10),
                user_text(node, 24),
                user_text(rec["port"], 24) if rec.get("port") else ",".join(map(str, gpus)) or "-",
                user_text(str(rec.get("cause") or "UNKNOWN").lower(), 16),
                "; ".join(x for x in slow if x) or "-",
            )  # fmt: skip
        return Group(head, Text(""), jobs, Text(""), flags, Text(""), recs)

    def render(self, width: int = 110) -> str:
        """The live view as plain text of ``width`` columns (the last screen, tests)."""
        return render([self.renderable()], width=width)

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
            node, gpu, port = str(label.get("node")), label.get("gpu_index"), label.get("port")
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
            # A NIC fault's finding names its port (no GPU): say which port was named.
            named = f" named port {flag.port}" if flag is not None and flag.port else ""
            where = f"port {port}" if port else f"gpu{gpu}"
            lines.append(
                f"  {verdict:6} {label.get('name')} on {node} {display_text(where)} "
                f"(job {label.get('job_id')}){display_text(named)}{drain_note}: "
                f"{display_text(detail, TEXT_MAX_CHARS)}"
            )
        extra = sorted(flagged_nodes - expected_nodes)
        for node in extra:
            ok = False
            lines.append(f"  EXTRA  {display_text(node)} was flagged without an injected fault")
        lines.append(
            "  result: every injected fault found, nothing else flagged"
            if ok
            else "  result: NOT as expected (see above)"
        )
        return "\n".join(lines), ok


def _where(gpu_index: int | None, port: str | None) -> Text:
    """The GPU column of a flag: the GPU's index, or the port a network finding names."""
    if gpu_index is not None:
        return Text(str(gpu_index))
    return user_text(port, 24) if port else Text("-")


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
