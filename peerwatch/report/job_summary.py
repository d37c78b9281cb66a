"""``peerwatch job JOBID``: one job's GPUs against their peers, its flagged GPUs, and a verdict.

A pure function of records (:func:`summarize_job`): the job's GpuWindows, its StragglerFindings,
the DrainRecommendations, DrainActions and node/job events around it. No I/O, no clock; the
command reads the records from Kafka or an archive and renders the result.

* Per GPU: the mean of each signal over the job's evaluated (ungated) windows, and the mean of
  its ratio to the job's per-window median (``*_vs_peers``: -0.081 = 8.1% below the peers;
  for the throttled share the difference in share instead, as the peers' median is usually 0).
* Flagged GPUs: every GPU a SUSPECT, CONFIRMED or HARD_ERROR finding names, with its worst
  status, the cause the detector named (UNKNOWN when it named none), the evidence of its latest
  finding, how long it was slow (its windows scored at or above ``z_threshold``) and by how much
  (its slowdown, :mod:`peerwatch.streams.core.slowdown`: the one figure every view shows), and what happened to its node (drained, drain recommended,
  alerted).
* The network line (:mod:`peerwatch.report.network`): each port (or leaf switch) of the job's
  nodes the stream named with cause NETWORK, what was recommended, and, where the caller folded
  the nodes' NIC samples, its seconds down, flaps and error rate over the job.
* A one-line verdict for the job's owner.

Every input is hostile: a record of the wrong shape is skipped and counted in ``skipped`` by
reason, never raised.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from peerwatch.producers.nic.window import PortWindow
from peerwatch.report.job_inputs import (
    TABLE_SIGNALS,
    Skips,
    Window,
    array,
    findings_of,
    number,
    records_with_node,
    windows_of,
)
from peerwatch.report.network import PortLine, line_text, network_ports
from peerwatch.streams.core.robust import median, quantile
from peerwatch.streams.core.slowdown import (
    duration_text,
    lead_feature,
    slow_z,
    slowdown,
    slowdown_text,
)

#: Finding statuses that flag a GPU, worst first.
FLAGGING: tuple[str, ...] = ("HARD_ERROR", "CONFIRMED", "SUSPECT")
#: Finding statuses about the job as a whole (no GPU blamed).
JOB_LEVEL: tuple[str, ...] = ("JOB_WIDE", "SILENT", "FLEET_WIDE")
#: Feature name in a finding -> (GpuWindow field, words for the verdict).
FEATURE_FIELD: dict[str, tuple[str, str]] = {
    "clk": ("clk_ratio", "SM clock"),
    "thr": ("throttle_frac", "throttling"),
    "sm": ("sm_frac", "SM activity"),
    "step": ("step_ms", "step time"),
    "power": ("power_ratio", "power"),
}


@dataclass(frozen=True)
class GpuRow:
    """One GPU of the job: signal means and their relation to the peers (None: no data)."""

    node: str
    gpu_index: int
    windows: int
    values: dict[str, float | None]
    vs_peers: dict[str, float | None]
    status: str | None = None
    cause: str | None = None


@dataclass(frozen=True)
class FlaggedGpu:
    """A GPU that findings flagged, with what the owner needs to know about it."""

    node: str
    gpu_index: int
    status: str
    cause: str
    reason: str
    evidence: list[str]
    hard_rules: list[str]
    first_flagged_ms: int
    last_flagged_ms: int
    cleared_ms: int | None
    feature: str | None
    slow_frac: float | None
    slow_s: float
    node_outcome: str | None
    node_outcome_ms: int | None


@dataclass
class JobSummary:
    """What :func:`summarize_job` found; ``verdict`` is the one line for the owner."""

    job_id: str
    user: str | None = None
    name: str | None = None
    account: str | None = None
    partition: str | None = None
    state: str | None = None
    start_ms: int | None = None
    end_ms: int | None = None
    nodes: list[str] = field(default_factory=list)
    gpus: int = 0
    windows: int = 0
    gated_windows: int = 0
    first_window_ms: int | None = None
    last_window_ms: int | None = None
    rows: list[GpuRow] = field(default_factory=list)
    peers: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    flagged: list[FlaggedGpu] = field(default_factory=list)
    job_findings: dict[str, int] = field(default_factory=dict)
    recommendations: list[dict[str, Any]] = field(default_factory=list)
    network: list[PortLine] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)
    verdict: str = ""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (the ``--json`` output)."""
        from dataclasses import asdict

        out = asdict(self)
        out["peers"] = {
            k: {"p10": v[0], "median": v[1], "p90": v[2]} for k, v in self.peers.items()
        }
        return out


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _peer_medians(windows: Sequence[Window]) -> dict[tuple[int, str], float]:
    """(window start, field) -> the job's median of that field in that window."""
    by: dict[tuple[int, str], list[float]] = {}
    for w in windows:
        for name, value in w.values.items():
            if value is not None:
                by.setdefault((w.start_ms, name), []).append(value)
    return {k: median(v) for k, v in by.items()}


def _relative(value: float, med: float, relative: bool) -> float | None:
    if not relative:
        return value - med
    return value / med - 1.0 if med > 0 else None


def _rows(windows: Sequence[Window], medians: Mapping[tuple[int, str], float]) -> list[GpuRow]:
    per_gpu: dict[tuple[str, int], list[Window]] = {}
    for w in windows:
        per_gpu.setdefault((w.node, w.gpu), []).append(w)
    rows = []
    for (node, gpu), ws in sorted(per_gpu.items()):
        used = [w for w in ws if not w.gated] or ws
        values: dict[str, float | None] = {}
        rel: dict[str, float | None] = {}
        for name, short, relative in TABLE_SIGNALS:
            vals = [v for w in used if (v := w.values[name]) is not None]
            rels = [
                r
                for w in used
                if (v := w.values[name]) is not None
                and (r := _relative(v, medians[(w.start_ms, name)], relative)) is not None
            ]
            values[short] = _mean(vals)
            rel[short] = _mean(rels)
        rows.append(GpuRow(node, gpu, len(used), values, rel))
    return rows


def _peer_band(rows: Sequence[GpuRow]) -> dict[str, tuple[float, float, float]]:
    band = {}
    for _, short, _ in TABLE_SIGNALS:
        vals = sorted(v for r in rows if (v := r.values.get(short)) is not None)
        if vals:
            band[short] = (quantile(vals, 0.1), quantile(vals, 0.5), quantile(vals, 0.9))
    return band


def evidence_lines(finding: Mapping[str, Any], z_threshold: float) -> list[str]:
    """The features of ``finding`` beyond ``z_threshold`` in their slow direction, as text
    (value, peer median, difference, z), then the hard rules that fired."""
    out = []
    for ev in array(finding.get("features")):
        if not isinstance(ev, Mapping):
            continue
        name = ev.get("feature")
        value, med, z = number(ev, "value"), number(ev, "peer_median"), number(ev, "z")
        if not isinstance(name, str) or value is None or med is None or z is None:
            continue
        if slow_z(name, z) < z_threshold:
            continue
        words = FEATURE_FIELD.get(name, (name, name))[1]
        # No percentage here: the one figure of how slow is the slowdown (streams/core/slowdown).
        out.append(f"latest evidence: {words} {value:.3f} vs peers {med:.3f} (z={z:+.1f})")
    out += [f"hard rule {r}" for r in array(finding.get("hard_rules")) if isinstance(r, str)]
    return out


def _node_outcome(
    node: str,
    since_ms: int,
    job_id: str,
    recommendations: Sequence[Mapping[str, Any]],
    node_events: Sequence[Mapping[str, Any]],
    actions: Sequence[Mapping[str, Any]],
) -> tuple[str | None, int | None]:
    """What happened to ``node`` after ``since_ms``: drained (a node event with the DRAIN flag
    or a DRAINED action), else the strongest recommendation about it for this job."""
    drained = [
        t
        for e in node_events
        if e.get("node") == node
        and (t := number(e, "ts_ms")) is not None
        and t >= since_ms
        and (
            "DRAIN" in [str(f).upper() for f in array(e.get("flags"))]
            or str(e.get("state", "")).upper().startswith("DRAIN")
        )
    ]
    drained += [
        t
        for a in actions
        if a.get("node") == node
        and a.get("decision") == "DRAINED"
        and (t := number(a, "ts_ms")) is not None
        and t >= since_ms
    ]
    if drained:
        return "node drained", int(min(drained))
    for action, words in (("DRAIN", "node drain recommended"), ("ALERT", "alert raised")):
        times = [
            t
            for r in recommendations
            if r.get("node") == node
            and r.get("action") == action
            and job_id in [str(j) for j in array(r.get("job_ids"))]
            and (t := number(r, "ts_ms")) is not None
        ]
        if times:
            return words, int(min(times))
    return None, None


def _flagged(
    job_id: str,
    findings: Sequence[Mapping[str, Any]],
    windows: Sequence[Window],
    recommendations: Sequence[Mapping[str, Any]],
    node_events: Sequence[Mapping[str, Any]],
    actions: Sequence[Mapping[str, Any]],
    z_threshold: float,
) -> list[FlaggedGpu]:
    by_gpu: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for f in findings:
        node, gpu = f.get("node"), f.get("gpu_index")
        if isinstance(node, str) and isinstance(gpu, int) and not isinstance(gpu, bool):
            by_gpu.setdefault((node, gpu), []).append(f)
    out = []
    for (node, gpu), fs in sorted(by_gpu.items()):
        fs = sorted(fs, key=lambda f: int(f["window_start_ms"]))
        flags = [f for f in fs if f.get("status") in FLAGGING]
        if not flags:
            continue
        status = min((str(f["status"]) for f in flags), key=FLAGGING.index)
        latest = flags[-1]
        named = [str(f.get("cause")) for f in flags if f.get("cause") not in (None, "UNKNOWN")]
        first = min(int(f.get("first_flagged_ms") or f["window_start_ms"]) for f in flags)
        last = max(int(f.get("window_end_ms") or f["window_start_ms"]) for f in flags)
        cleared = [
            int(f.get("window_end_ms") or f["window_start_ms"])
            for f in fs
            if f.get("status") == "CLEARED" and int(f["window_start_ms"]) >= last
        ]
        feature = lead_feature([e for f in flags for e in array(f.get("features"))])
        slow = [w for w in windows if (w.node, w.gpu) == (node, gpu)]
        slow = [w for w in slow if w.score is not None and w.score >= z_threshold]
        slow_frac = slowdown(flags, feature)
        slow_s = sum(w.end_ms - w.start_ms for w in slow) / 1000 if slow else (last - first) / 1000
        outcome, outcome_ms = _node_outcome(
            node, first, job_id, recommendations, node_events, actions
        )
        out.append(
            FlaggedGpu(
                node=node, gpu_index=gpu, status=status,
                cause=named[-1] if named else "UNKNOWN",
                reason=str(latest.get("reason") or ""),
                evidence=evidence_lines(latest, z_threshold),
                hard_rules=sorted({str(r) for f in flags for r in array(f.get("hard_rules"))}),
                first_flagged_ms=first, last_flagged_ms=last,
                cleared_ms=max(cleared) if cleared else None,
                feature=feature, slow_frac=slow_frac, slow_s=slow_s,
                node_outcome=outcome, node_outcome_ms=outcome_ms,
            )
        )  # fmt: skip
    out.sort(key=lambda g: (FLAGGING.index(g.status), -g.slow_s, g.node, g.gpu_index))
    return out


def _job_info(summary: JobSummary, events: Iterable[Any], skips: Skips) -> None:
    nodes: set[str] = set()
    gpus: set[tuple[str, int]] = set()
    timed = []
    for e in events:
        if isinstance(e, Mapping) and isinstance(e.get("ts_ms"), int):
            timed.append(e)
        else:
            skips.add("job event", "not a record with a time")
    for ev in sorted(timed, key=lambda e: int(e["ts_ms"])):
        if str(ev.get("job_id")) != summary.job_id:
            continue
        for name in ("user", "partition", "account"):
            if isinstance(ev.get(name), str):
                setattr(summary, name, ev[name])
        if isinstance(ev.get("job_name"), str):
            summary.name = ev["job_name"]
        if isinstance(ev.get("state"), str):
            summary.state = ev["state"]
        for name in ("start_ms", "end_ms"):
            if isinstance(ev.get(name), int) and not isinstance(ev.get(name), bool):
                setattr(summary, name, ev[name])
        allocations = ev.get("allocations")
        if not isinstance(allocations, list):
            skips.add("job event", "allocations not a list")
            continue
        for a in allocations:
            if isinstance(a, Mapping) and isinstance(a.get("node"), str):
                nodes.add(a["node"])
                for g in array(a.get("gpu_indices")):
                    if isinstance(g, int):
                        gpus.add((a["node"], g))
    summary.nodes = sorted(nodes)
    summary.gpus = len(gpus)


def verdict(summary: JobSummary) -> str:
    """The one line for the job's owner (see the module doc)."""
    if not summary.flagged:
        if not summary.windows and not summary.job_findings:
            if not summary.network:
                return f"job {summary.job_id}: no GPU windows or findings found for this job"
            return f"job {summary.job_id}: no GPU windows found" + _network_clause(summary)
        span = ""
        if summary.first_window_ms is not None and summary.last_window_ms is not None:
            span = (
                f" over {duration_text((summary.last_window_ms - summary.first_window_ms) / 1000)}"
            )
        text = f"job {summary.job_id}: no GPU stood out from its {len(summary.rows)} peers{span}"
        shared = sum(summary.job_findings.values())
        if shared:
            kinds = ", ".join(f"{n} {k}" for k, n in sorted(summary.job_findings.items()))
            text += f"; {shared} job-level finding(s) ({kinds}): a shared cause, no GPU blamed"
        return text + _network_clause(summary)
    g = summary.flagged[0]
    if g.status == "HARD_ERROR":
        what = f"GPU {g.gpu_index} on {g.node} hit a hard error ({', '.join(g.hard_rules)})"
    else:
        how = slowdown_text(g.feature, g.slow_frac)
        how = f"was {how}" if g.feature == "thr" and g.slow_frac is not None else f"ran {how}"
        what = f"GPU {g.gpu_index} on {g.node} {how} for {duration_text(g.slow_s)}"
    parts = [what, f"cause {g.cause}" if g.cause != "UNKNOWN" else "cause not named"]
    if g.node_outcome:
        parts.append(g.node_outcome)
    text = "; ".join(parts)
    if len(summary.flagged) > 1:
        text += f" (+{len(summary.flagged) - 1} more flagged GPU(s))"
    return text + _network_clause(summary)


def _network_clause(summary: JobSummary) -> str:
    """``; network: <the worst port's line> (+N more)`` when the stream named a port."""
    if not summary.network:
        return ""
    text = f"; network: {line_text(replace(summary.network[0], reason=''))}"
    more = len(summary.network) - 1
    return text + (f" (+{more} more port(s))" if more else "")


def summarize_job(
    job_id: str,
    windows: Iterable[Any] = (),
    findings: Iterable[Any] = (),
    recommendations: Iterable[Any] = (),
    job_events: Iterable[Any] = (),
    node_events: Iterable[Any] = (),
    actions: Iterable[Any] = (),
    *,
    z_threshold: float = 3.5,
    nic_ports: Mapping[tuple[str, str], PortWindow] | None = None,
) -> JobSummary:
    """The summary of job ``job_id`` from any mix of records (other jobs' are ignored; bad ones
    are counted in ``skipped``). ``z_threshold``: the detector's (a window scored at or above
    it counts as slow). ``nic_ports``: the job's NIC samples folded per port
    (:meth:`peerwatch.report.network.PortTotals.windows`), for the network line's figures.
    Raises nothing for bad input."""
    job_id = str(job_id)
    skips = Skips()
    summary = JobSummary(job_id)
    _job_info(summary, job_events, skips)
    ws = windows_of(job_id, windows, skips)
    medians = _peer_medians(ws)
    summary.windows = len(ws)
    summary.gated_windows = sum(w.gated for w in ws)
    if ws:
        summary.first_window_ms = min(w.start_ms for w in ws)
        summary.last_window_ms = max(w.end_ms for w in ws)
    fs = findings_of(job_id, findings, skips)
    recs = [
        r
        for r in records_with_node("recommendation", recommendations, skips)
        if job_id in [str(j) for j in array(r.get("job_ids"))]
    ]
    summary.recommendations = [dict(r) for r in recs]
    summary.network = network_ports(job_id, fs, recs, nic_ports, skips=skips)
    summary.flagged = _flagged(
        job_id, fs, ws, recs,
        records_with_node("node event", node_events, skips), records_with_node("drain action", actions, skips),
        z_threshold,
    )  # fmt: skip
    by_gpu = {(g.node, g.gpu_index): g for g in summary.flagged}
    summary.rows = [
        GpuRow(r.node, r.gpu_index, r.windows, r.values, r.vs_peers,
               by_gpu[(r.node, r.gpu_index)].status if (r.node, r.gpu_index) in by_gpu else None,
               by_gpu[(r.node, r.gpu_index)].cause if (r.node, r.gpu_index) in by_gpu else None)
        for r in _rows(ws, medians)
    ]  # fmt: skip
    summary.peers = _peer_band(summary.rows)
    for f in fs:
        if f.get("status") in JOB_LEVEL:
            summary.job_findings[str(f["status"])] = (
                summary.job_findings.get(str(f["status"]), 0) + 1
            )
    if not summary.gpus:
        summary.gpus = len(summary.rows)
    if not summary.nodes:
        summary.nodes = sorted({w.node for w in ws})
    summary.skipped = dict(sorted(skips.counts.items()))
    summary.verdict = verdict(summary)
    return summary
