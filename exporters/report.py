"""The incident report: one self-contained HTML page (inline CSS, the uPlot chart library and
the data inlined; no external file, font or request), built from a replay's windows, findings,
recommendations and events.

Per job with findings: the verdict and plain advice per flagged GPU; for each signal (SM clock
ratio, throttle, SM activity, power ratio) an interactive chart (:mod:`peerwatch.exporters.
report_charts`) of the peers' p10-p90 band and median per window, with every flagged GPU in red;
then the findings and recommendations with their evidence, and a timeline of the job's and its
nodes' events, node lists as Slurm hostlists. Every text from the records is shown through
:func:`peerwatch.display.display_text` and HTML-escaped.
"""

from __future__ import annotations

import datetime as dt
import html
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from peerwatch.display import TEXT_MAX_CHARS, display_text
from peerwatch.exporters.report_charts import (
    BAND,
    HIGHLIGHT,
    MEDIAN,
    chart_data,
    chart_div,
    chart_head,
    chart_scripts,
)
from peerwatch.producers.slurm.hostlist import hostlist_text as hostlist
from peerwatch.streams.core.robust import quantile

SIGNALS: tuple[tuple[str, str], ...] = (
    ("clk_ratio", "SM clock / max"),
    ("throttle_frac", "throttled share"),
    ("sm_frac", "SM activity"),
    ("power_ratio", "power / limit"),
)
_CSS = f"""
body{{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#1a202c}}
h1{{font-size:22px}} h2{{font-size:18px;margin-top:32px;border-bottom:1px solid #cbd5e0}}
table{{border-collapse:collapse;margin:8px 0 16px}} td,th{{border:1px solid #e2e8f0;padding:3px 6px;
text-align:left;vertical-align:top;font-size:12px}} th{{background:#edf2f7}}
.charts{{display:flex;flex-wrap:wrap;gap:8px}} .chart{{border:1px solid #e2e8f0;padding:4px}}
.chart .note{{color:#718096;margin:2px 8px}} ul.advice li{{margin:4px 0}}
.straggler{{color:{HIGHLIGHT};font-weight:bold}} .legend span{{margin-right:14px}}
.swatch{{display:inline-block;width:14px;height:10px;margin-right:4px;vertical-align:middle}}
tr.finding.CONFIRMED,tr.finding.HARD_ERROR{{background:#fff5f5}}
.verdict{{font-size:16px;font-weight:bold;padding:8px 12px;border-left:6px solid}}
.verdict.bad{{border-color:{HIGHLIGHT};background:#fff5f5}} .verdict.ok{{border-color:#38a169;
background:#f0fff4}} td.num{{text-align:right;font-variant-numeric:tabular-nums}}
tr.flagged td{{color:{HIGHLIGHT};font-weight:bold}} td:first-child{{white-space:nowrap}} tr.peers td{{color:#718096}}
"""


def _t(ms: int | None) -> str:
    if ms is None:
        return ""
    return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _e(value: Any, max_chars: int = TEXT_MAX_CHARS) -> str:
    """Outside text for the page: escaped for display (control and bidi characters as visible
    escapes, capped), then for HTML."""
    return html.escape(display_text(value, max_chars), quote=True)


def peer_band(
    windows: Iterable[Mapping[str, Any]], signal: str
) -> list[tuple[int, float, float, float]]:
    """Per window start: (start ms, p10, median, p90) of ``signal`` over the job's GPUs."""
    by_start: dict[int, list[float]] = {}
    for w in windows:
        v = w.get(signal)
        if isinstance(v, int | float) and math.isfinite(v):
            by_start.setdefault(int(w["window_start_ms"]), []).append(float(v))
    out = []
    for start in sorted(by_start):
        vs = sorted(by_start[start])
        out.append((start, quantile(vs, 0.1), quantile(vs, 0.5), quantile(vs, 0.9)))
    return out


def flagged_gpus(findings: Iterable[Mapping[str, Any]]) -> list[tuple[str, int]]:
    """(node, GPU) of every finding that names a GPU, in order of first appearance."""
    seen: dict[tuple[str, int], None] = {}
    for f in findings:
        if f.get("node") is not None and f.get("gpu_index") is not None:
            seen.setdefault((str(f["node"]), int(f["gpu_index"])), None)
    return list(seen)


def chart_html(
    job_id: str,
    signal: str,
    title: str,
    windows: Sequence[Mapping[str, Any]],
    flagged: Sequence[tuple[str, int]],
    max_points: int = 600,
) -> str:
    """One signal's interactive chart (see :mod:`peerwatch.exporters.report_charts`); ``""``
    when no window has the signal."""
    series: dict[tuple[str, int], dict[int, float]] = {g: {} for g in flagged}
    for w in windows:
        key = (str(w["node"]), int(w["gpu_index"]))
        v = w.get(signal)
        if key in series and isinstance(v, int | float) and math.isfinite(v):
            series[key][int(w["window_start_ms"])] = float(v)
    data = chart_data(job_id, signal, title, peer_band(windows, signal), series, max_points)
    return "" if data is None else chart_div(data)


def _evidence(f: Mapping[str, Any]) -> str:
    items = [
        f"{_e(x['feature'])}={x['value']:.3f} (peers {x['peer_median']:.3f}, z={x['z']:.1f})"
        for x in f.get("features") or []
    ]
    items += [f"rule {_e(r)}" for r in f.get("hard_rules") or []]
    return "; ".join(items)


def findings_table(findings: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        f'<tr class="finding {_e(f.get("status"))}" data-finding-id="{_e(f["finding_id"])}">'
        f"<td>{_t(f['window_start_ms'])}</td><td>{_e(f.get('node') or '—')}</td>"
        f"<td>{_e('' if f.get('gpu_index') is None else f['gpu_index'])}</td>"
        f"<td>{_e(f.get('status'))}</td><td>{_e(f.get('cause') or 'UNKNOWN')}</td>"
        f"<td>{_e(f.get('reason', ''))}</td><td>{_evidence(f)}</td>"
        f"<td>{f.get('windows_flagged', 0)}/{f.get('windows_considered', 0)}</td></tr>"
        for f in findings
    ]
    head = ("<tr><th>window</th><th>node</th><th>GPU</th><th>status</th><th>cause</th>"
            "<th>reason</th><th>evidence</th><th>flagged windows</th></tr>")  # fmt: skip
    return f'<table class="findings">{head}{"".join(rows)}</table>'


def _rec_evidence(evidence: Any) -> str:
    if isinstance(evidence, list):
        return "<br>".join(
            _e(f"{e.get('kind', '')}: {e.get('detail', '')}") if isinstance(e, Mapping) else _e(e)
            for e in evidence
        )
    return _e(evidence or "")


def recommendations_table(recs: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        f'<tr class="recommendation" data-recommendation-id="{_e(r["recommendation_id"])}">'
        f"<td>{_t(r['ts_ms'])}</td><td>{_e(r['node'])}</td><td>{_e(r.get('action'))}</td>"
        f"<td>{_e(r.get('severity'))}</td><td>{_e(r.get('cause') or 'UNKNOWN')}</td>"
        f"<td>{_e(r.get('reason'))}</td>"
        f"<td>{_e(', '.join(str(g) for g in r.get('gpu_indices') or []))}</td>"
        f"<td>{_rec_evidence(r.get('evidence'))}</td></tr>"
        for r in recs
    ]
    head = ("<tr><th>time</th><th>node</th><th>action</th><th>severity</th><th>cause</th>"
            "<th>reason</th><th>GPUs</th><th>evidence</th></tr>")  # fmt: skip
    return f'<table class="recommendations">{head}{"".join(rows)}</table>'


def timeline(events: Sequence[tuple[str, Mapping[str, Any]]]) -> str:
    """Job and node events as a table in time order; node events of the same time, state and
    reason share one row."""
    rows: list[tuple[str, int, str, list[str], str]] = []
    nodes_of: dict[tuple[int, str, str], list[str]] = {}
    for stream, ev in sorted(events, key=lambda e: (int(e[1].get("ts_ms") or 0), e[0])):
        ts = int(ev.get("ts_ms") or 0)
        if stream == "job-events":
            alloc = hostlist(a.get("node") for a in ev.get("allocations") or [] if a.get("node"))
            rows.append((stream, ts, f"job {ev.get('job_id')} {ev.get('kind')}", [], alloc))
            continue
        state, reason = str(ev.get("state")), str(ev.get("reason") or "")
        key = (ts, state, reason)
        if key not in nodes_of:
            nodes_of[key] = []
            rows.append((stream, ts, state, nodes_of[key], reason))
        nodes_of[key].append(str(ev.get("node")))
    body = []
    for stream, ts, label, nodes, detail in rows:
        what = str(label)
        if stream != "job-events":
            what = f"node{'s' if len(nodes) > 1 else ''} {hostlist(nodes)} {label}"
        body.append(
            f'<tr class="event {stream}"><td>{_t(ts)}</td><td>{_e(what)}</td>'
            f"<td>{_e(detail)}</td></tr>"
        )
    head = "<tr><th>time</th><th>event</th><th>detail</th></tr>"
    return f'<table class="timeline">{head}{"".join(body)}</table>'


def advice_list(summary: Any) -> str:
    """Plain advice, one item per flagged GPU (:func:`peerwatch.report.advice.advice`)."""
    from peerwatch.report.advice import advice

    items = "".join(f"<li>{_e(advice(g), 600)}</li>" for g in summary.flagged)
    return f'<h3>What to do</h3><ul class="advice">{items}</ul>' if items else ""


def network_table(lines: Sequence[Any]) -> str:
    """The network line of a job (:class:`peerwatch.report.network.PortLine` s): one row per
    port or leaf switch the stream named; empty without any."""
    if not lines:
        return ""
    rows = "".join(
        f'<tr class="port" data-node="{_e(x.node or "")}" data-port="{_e(x.port or "")}">'
        f"<td>{_e(x.node or '')}</td><td>{_e(x.port or ('switch ' + str(x.switch)))}</td>"
        f"<td>{_e(', '.join(x.statuses))}</td><td>{_e(', '.join(x.rules))}</td>"
        f"<td>{_e({'DRAIN': 'drain recommended', 'ALERT': 'alert'}.get(x.action or '', ''))}</td>"
        f'<td class="num">{"" if x.down_s is None else f"{x.down_s:.1f}"}</td>'
        f'<td class="num">{"" if x.flaps is None else x.flaps}</td>'
        f'<td class="num">{"" if x.errors_per_s is None else f"{x.errors_per_s:.2f}"}</td>'
        f"<td>{_t(x.first_ms)}</td><td>{_e(x.reason)}</td></tr>"
        for x in lines
    )
    return (
        '<h3>Network</h3><table class="network"><tr><th>node</th><th>port</th><th>status</th>'
        "<th>rules</th><th>recommended</th><th>down s</th><th>flaps</th><th>errors/s</th>"
        f"<th>first (UTC)</th><th>reason</th></tr>{rows}</table>"
    )


def job_section(
    job_id: str,
    windows: Sequence[Mapping[str, Any]],
    findings: Sequence[Mapping[str, Any]],
    recs: Sequence[Mapping[str, Any]],
    events: Sequence[tuple[str, Mapping[str, Any]]],
    summary: Any = None,
) -> str:
    """One job: the verdict and advice (from ``summary``, a JobSummary, when given), the
    charts, its findings, recommendations and timeline."""
    flagged = flagged_gpus(findings)
    names = ", ".join(f"{n} GPU {g}" for n, g in flagged) or "none (job-level findings only)"
    charts = "".join(chart_html(job_id, s, t, windows, flagged) for s, t in SIGNALS)
    gpus = {(str(w["node"]), w["gpu_index"]) for w in windows}
    nodes = hostlist(n for n, _ in gpus)
    verdict = (
        f'<p class="verdict {"bad" if flagged else "ok"}">{_e(summary.verdict)}</p>'
        + advice_list(summary)
        if summary is not None
        else ""
    )
    return (
        f'<section class="job" id="job-{_e(job_id)}" data-job="{_e(job_id)}">'
        f"<h2>Job {_e(job_id)}</h2>{verdict}"
        f'<p>{len(gpus)} GPUs on {_e(nodes, 2000)}. Flagged: <span class="straggler">'
        f"{_e(names, 2000)}</span></p>"
        f'<p class="legend"><span><i class="swatch" style="background:{BAND}"></i>peers p10-p90'
        f'</span><span><i class="swatch" style="background:{MEDIAN}"></i>peer median</span>'
        f'<span><i class="swatch" style="background:{HIGHLIGHT}"></i>flagged GPU</span> '
        "(hover for values; drag to zoom the time, double-click to reset)</p>"
        f'<div class="charts">{charts}</div>'
        f"{network_table(summary.network) if summary is not None else ''}"
        f"<h3>Findings</h3>{findings_table(findings)}"
        f"<h3>Recommendations</h3>{recommendations_table(recs)}"
        f"<h3>Timeline</h3>{timeline(events)}</section>"
    )


def _page(title: str, body: str) -> str:
    """A self-contained page: the styles and uPlot inlined, the charts drawn at the end."""
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{_e(title)}</title><style>{_CSS}</style>{chart_head()}</head><body>"
        f"{body}{chart_scripts()}</body></html>"
    )


def render_report(
    windows: Sequence[Mapping[str, Any]],
    findings: Sequence[Mapping[str, Any]],
    recommendations: Sequence[Mapping[str, Any]],
    events: Sequence[tuple[str, Mapping[str, Any]]],
    *,
    title: str = "peerwatch incident report",
    from_ms: int | None = None,
    to_ms: int | None = None,
) -> str:
    """The whole page. Jobs appear in id order, only those with findings."""
    jobs = sorted({str(f["job_id"]) for f in findings})
    sections = []
    for job in jobs:
        jf = [f for f in findings if str(f["job_id"]) == job]
        nodes = {str(w["node"]) for w in windows if str(w["job_id"]) == job}
        jr = [r for r in recommendations if job in (r.get("job_ids") or [])]
        jev = [
            (s, e) for s, e in events
            if (s == "job-events" and str(e.get("job_id")) == job)
            or (s == "node-events" and str(e.get("node")) in nodes)
        ]  # fmt: skip
        jw = [w for w in windows if str(w["job_id"]) == job]
        sections.append(job_section(job, jw, jf, jr, jev, _summary(job, jw, jf, jr, jev)))
    other = [r for r in recommendations if not set(r.get("job_ids") or []) & set(jobs)]
    span = f"{_t(from_ms)} to {_t(to_ms)} UTC" if from_ms is not None else ""
    return _page(
        title,
        f"<h1>{_e(title)}</h1><p>{_e(span)} · {len(jobs)} job(s) with findings · "
        f"{len(findings)} findings · {len(recommendations)} recommendations</p>"
        + "".join(sections)
        + (f"<h2>Other recommendations</h2>{recommendations_table(other)}" if other else ""),
    )


def _summary(
    job_id: str,
    windows: Sequence[Mapping[str, Any]],
    findings: Sequence[Mapping[str, Any]],
    recs: Sequence[Mapping[str, Any]],
    events: Sequence[tuple[str, Mapping[str, Any]]],
) -> Any:
    """The job's summary (verdict, flagged GPUs), as ``peerwatch job`` makes it."""
    from peerwatch.report.job_summary import summarize_job

    return summarize_job(
        job_id, windows, findings, recs,
        [e for s, e in events if s == "job-events"], [e for s, e in events if s == "node-events"],
    )  # fmt: skip


def gpu_table_html(summary: Any, rows: Sequence[Any]) -> str:
    """The job's GPUs against their peers (a :class:`JobSummary`'s rows), then the peer band."""
    from peerwatch.job_view import COLUMNS, cell, rel_text

    shorts = [s for s in ("clk", "sm", "power", "thr", "step") if s in summary.peers]
    head = "<tr><th>node</th><th>GPU</th>" + "".join(
        f"<th>{_e(COLUMNS[s][0])}</th><th>vs peers</th>" for s in shorts
    ) + "<th>status (cause)</th></tr>"  # fmt: skip
    body = []
    for r in rows:
        cells = "".join(
            f'<td class="num">{_e(cell(s, r.values.get(s)))}</td>'
            f'<td class="num">{_e(rel_text(s, r.vs_peers.get(s)))}</td>'
            for s in shorts
        )
        status = f"{r.status} ({r.cause})" if r.status else ""
        body.append(
            f'<tr class="gpu{" flagged" if r.status else ""}" data-node="{_e(r.node)}" '
            f'data-gpu="{r.gpu_index}"><td>{_e(r.node)}</td><td class="num">{r.gpu_index}</td>'
            f"{cells}<td>{_e(status)}</td></tr>"
        )
    for i, label in enumerate(("peers p10", "peers median", "peers p90")):
        cells = "".join(
            f'<td class="num">{_e(cell(s, summary.peers[s][i]))}</td><td></td>' for s in shorts
        )
        body.append(f'<tr class="peers"><td colspan="2">{label}</td>{cells}<td></td></tr>')
    return f'<table class="gpus">{head}{"".join(body)}</table>'


def render_job_report(
    summary: Any,
    windows: Sequence[Mapping[str, Any]],
    findings: Sequence[Mapping[str, Any]],
    recommendations: Sequence[Mapping[str, Any]],
    events: Sequence[tuple[str, Mapping[str, Any]]],
) -> str:
    """``peerwatch job --html``: one job's page (a :class:`JobSummary` and its records): the
    verdict, the flagged GPUs with cause and evidence, the GPU table, then the incident report's
    section of that job (charts, findings, recommendations, timeline). Self-contained."""
    from peerwatch.job_view import shown_rows
    from peerwatch.report.advice import advice
    from peerwatch.streams.core.slowdown import slowdown_text

    s = summary
    job = str(s.job_id)
    jw = [w for w in windows if str(w.get("job_id")) == job]
    jf = [f for f in findings if str(f.get("job_id")) == job]
    who = " · ".join(
        f"{k} {v}" for k, v in (("user", s.user), ("job name", s.name), ("account", s.account),
                                ("partition", s.partition), ("state", s.state)) if v
    )  # fmt: skip
    flagged = "".join(
        f'<tr class="flagged-gpu" data-node="{_e(g.node)}" data-gpu="{g.gpu_index}">'
        f"<td>{_e(g.node)} GPU {g.gpu_index}</td><td>{_e(g.status)}</td><td>{_e(g.cause)}</td>"
        f"<td>{_e(slowdown_text(g.feature, g.slow_frac) if g.feature else '')}</td>"
        f"<td>{_t(g.first_flagged_ms)[11:]}"
        f"{f' to {_t(g.cleared_ms)[11:]} (cleared)' if g.cleared_ms else ' (not cleared)'}</td>"
        f"<td>{'<br>'.join(_e(x) for x in g.evidence)}</td><td>{_e(g.node_outcome or '')}</td>"
        f"<td>{_e(advice(g), 600)}</td></tr>"
        for g in s.flagged
    )
    flagged_table = (
        '<h2>Flagged GPUs</h2><table class="flagged"><tr><th>GPU</th><th>status</th>'
        "<th>cause</th><th>slowdown</th><th>flagged (UTC)</th><th>evidence</th><th>node</th>"
        "<th>what to do</th>"
        "</tr>"
        f"{flagged}</table>"
        if s.flagged
        else ""
    )
    nodes = set(s.nodes)
    jev = [
        (k, e) for k, e in events
        if (k == "job-events" and str(e.get("job_id")) == job)
        or (k == "node-events" and str(e.get("node")) in nodes)
    ]  # fmt: skip
    section = job_section(job, jw, jf, recommendations, jev)
    return _page(
        f"peerwatch job {job}",
        f"<h1>peerwatch job {_e(job)}</h1><p>{_e(who, 600)}</p>"
        f"<p>{s.gpus} GPUs on {len(s.nodes)} nodes ({_e(hostlist(s.nodes), 2000)}) · windows "
        f"{_t(s.first_window_ms)} to {_t(s.last_window_ms)[11:]} UTC · {s.windows} GPU windows</p>"
        f'<p class="verdict {"bad" if s.flagged else "ok"}">{_e(s.verdict)}</p>'
        f"{flagged_table}"
        f"{network_table(s.network)}"
        f"<h2>GPUs against their {len(s.rows)} peers (means over the job)</h2>"
        f"{gpu_table_html(s, shown_rows(s))}"
        f"{section}",
    )
