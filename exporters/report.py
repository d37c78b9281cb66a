"""The incident report: one self-contained HTML page (inline CSS and SVG, no script, no external
file or font), built from a replay's windows, findings, recommendations and events.

Per job with findings: for each signal (SM clock ratio, throttle, SM activity, power ratio) a
chart of the peers' p10-p90 band and median per window, with every flagged GPU drawn over it in
red and labelled; then the findings and recommendations with their evidence, and a timeline of
the job's and its nodes' events. Long ranges are downsampled to at most ``max_points`` per line.
"""

from __future__ import annotations

import datetime as dt
import html
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from peerwatch.streams.core.robust import quantile

HIGHLIGHT = "#d62728"
BAND = "#c6dbef"
MEDIAN = "#4a5568"
SIGNALS: tuple[tuple[str, str], ...] = (
    ("clk_ratio", "SM clock / max"),
    ("throttle_frac", "throttled share"),
    ("sm_frac", "SM activity"),
    ("power_ratio", "power / limit"),
)
_W, _H, _PAD_L, _PAD_R, _PAD_T, _PAD_B = 560, 170, 44, 120, 16, 22
_CSS = f"""
body{{font:14px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px;color:#1a202c}}
h1{{font-size:22px}} h2{{font-size:18px;margin-top:32px;border-bottom:1px solid #cbd5e0}}
table{{border-collapse:collapse;margin:8px 0 16px}} td,th{{border:1px solid #e2e8f0;padding:3px 6px;
text-align:left;vertical-align:top;font-size:12px}} th{{background:#edf2f7}}
.charts{{display:flex;flex-wrap:wrap;gap:8px}} .chart{{border:1px solid #e2e8f0}}
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


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def downsample(points: Sequence[tuple[int, float]], max_points: int) -> list[tuple[int, float]]:
    """At most ``max_points`` points: consecutive points averaged in equal buckets."""
    if len(points) <= max_points:
        return list(points)
    size = len(points) / max_points
    out = []
    for i in range(max_points):
        chunk = points[int(i * size) : int((i + 1) * size)] or [points[-1]]
        out.append((chunk[len(chunk) // 2][0], sum(v for _, v in chunk) / len(chunk)))
    return out


def peer_band(
    windows: Iterable[Mapping[str, Any]], signal: str
) -> list[tuple[int, float, float, float]]:
    """Per window start: (start ms, p10, median, p90) of ``signal`` over the job's GPUs."""
    by_start: dict[int, list[float]] = {}
    for w in windows:
        v = w.get(signal)
        if v is not None:
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


def _path(points: Sequence[tuple[float, float]]) -> str:
    return " ".join(f"{'M' if i == 0 else 'L'}{x:.1f},{y:.1f}" for i, (x, y) in enumerate(points))


#: Per signal: the smallest y span a chart shows, and the bounds no axis goes beyond (so a job
#: whose values all agree gets a meaningful axis, not one 0.1 wide around the value).
_Y_SPAN: dict[str, tuple[float, float, float]] = {
    "clk_ratio": (0.02, 0.0, 1.0),
    "throttle_frac": (0.1, 0.0, 1.0),
    "sm_frac": (0.1, 0.0, 1.0),
    "power_ratio": (0.1, 0.0, 2.0),
}
_LABEL_GAP = 11.0  # px between two GPU labels at the right end of a chart


def y_range(signal: str, values: Sequence[float]) -> tuple[float, float]:
    """The chart's y axis for ``values`` of ``signal``: their range, widened to the signal's
    smallest span (centred, kept within the signal's bounds). A share that is all zero (nothing
    throttled) gets ``[0, span]``."""
    lo, hi = min(values), max(values)
    min_span, floor, ceil = _Y_SPAN.get(signal, (1e-6, -math.inf, math.inf))
    if hi - lo < min_span:
        mid = (lo + hi) / 2
        lo, hi = mid - min_span / 2, mid + min_span / 2
        if lo < floor:
            lo, hi = floor, floor + min_span
        if hi > ceil:
            lo, hi = ceil - min_span, ceil
    return lo, hi


def spread_labels(ys: Sequence[float], top: float, bottom: float, gap: float) -> list[float]:
    """Label positions near ``ys`` (same order), at least ``gap`` apart and within
    ``[top, bottom]`` where there is room: labels of GPUs that end at the same value stack."""
    order = sorted(range(len(ys)), key=lambda i: ys[i])
    placed = [0.0] * len(ys)
    last = -math.inf
    for i in order:
        placed[i] = max(ys[i], last + gap, top)
        last = placed[i]
    overflow = (last - bottom) if ys else 0.0
    if overflow > 0:  # pushed past the bottom: shift the stack up, never above the top
        shift = min(overflow, max(0.0, min(placed) - top))
        placed = [p - shift for p in placed]
    return placed


def _fmt_axis(signal: str, v: float) -> str:
    if signal in ("throttle_frac", "sm_frac"):
        return f"{v * 100:.0f}%"
    return f"{v:.3g}"


def chart_svg(
    job_id: str,
    signal: str,
    title: str,
    windows: Sequence[Mapping[str, Any]],
    flagged: Sequence[tuple[str, int]],
    max_points: int = 240,
) -> str:
    """One signal's chart: the peer band and median, the flagged GPUs in red with labels that
    never overlap (stacked at the right end), a mid gridline; a flat zero throttle chart says
    that nothing was throttled."""
    band = peer_band(windows, signal)
    if not band:
        return ""
    series = {
        g: [(int(w["window_start_ms"]), float(w[signal])) for w in windows
            if (str(w["node"]), int(w["gpu_index"])) == g and w.get(signal) is not None]
        for g in flagged
    }  # fmt: skip
    xs = [b[0] for b in band]
    values = [v for b in band for v in (b[1], b[3])] + [v for s in series.values() for _, v in s]
    x0, x1 = min(xs), max(xs) or 1
    y0, y1 = y_range(signal, values)
    span_x = max(1, x1 - x0)
    plot_w, plot_h = _W - _PAD_L - _PAD_R, _H - _PAD_T - _PAD_B

    def xy(t: int, v: float) -> tuple[float, float]:
        return _PAD_L + (t - x0) / span_x * plot_w, _PAD_T + (y1 - v) / (y1 - y0) * plot_h

    lo = downsample([(b[0], b[1]) for b in band], max_points)
    hi = downsample([(b[0], b[3]) for b in band], max_points)
    med = downsample([(b[0], b[2]) for b in band], max_points)
    area = [xy(t, v) for t, v in hi] + [xy(t, v) for t, v in reversed(lo)]
    mid_y = _PAD_T + plot_h / 2
    parts = [
        f'<svg class="chart" data-job="{_e(job_id)}" data-signal="{signal}" width="{_W}" '
        f'height="{_H}" viewBox="0 0 {_W} {_H}" role="img" aria-label="{_e(title)}">',
        f'<text x="{_PAD_L}" y="11" font-size="11" font-weight="bold" fill="#2d3748">'
        f"{_e(title)}</text>",
        f'<rect x="{_PAD_L}" y="{_PAD_T}" width="{plot_w}" height="{plot_h}" fill="none" '
        f'stroke="#e2e8f0"/>',
        f'<line x1="{_PAD_L}" y1="{mid_y:.1f}" x2="{_PAD_L + plot_w}" y2="{mid_y:.1f}" '
        f'stroke="#edf2f7"/>',
        f'<text x="{_PAD_L - 4}" y="{_PAD_T + 8}" font-size="9" fill="#718096" '
        f'text-anchor="end">{_fmt_axis(signal, y1)}</text>',
        f'<text x="{_PAD_L - 4}" y="{mid_y + 3:.1f}" font-size="9" fill="#718096" '
        f'text-anchor="end">{_fmt_axis(signal, (y0 + y1) / 2)}</text>',
        f'<text x="{_PAD_L - 4}" y="{_H - _PAD_B}" font-size="9" fill="#718096" '
        f'text-anchor="end">{_fmt_axis(signal, y0)}</text>',
        f'<text x="{_PAD_L}" y="{_H - 6}" font-size="9" fill="#718096">{_t(x0)[11:]}</text>',
        f'<text x="{_W - _PAD_R}" y="{_H - 6}" font-size="9" fill="#718096" '
        f'text-anchor="end">{_t(x1)[11:]} UTC</text>',
        f'<path class="band" d="{_path(area)} Z" fill="{BAND}" stroke="none"/>',
        f'<path class="median" d="{_path([xy(t, v) for t, v in med])}" fill="none" '
        f'stroke="{MEDIAN}" stroke-width="1.2"/>',
    ]
    if max(abs(v) for v in values) < 1e-9 and signal == "throttle_frac":
        parts.append(
            f'<text class="note" x="{_PAD_L + plot_w / 2:.1f}" y="{mid_y + 4:.1f}" '
            f'font-size="12" fill="#718096" text-anchor="middle">'
            f"nothing throttled (all GPUs at 0%)</text>"
        )
    lines = {g: [xy(t, v) for t, v in downsample(pts, max_points)] for g, pts in series.items()}
    lines = {g: line for g, line in lines.items() if line}
    label_ys = spread_labels(
        [line[-1][1] + 4 for line in lines.values()], _PAD_T + 8, _H - _PAD_B + 4, _LABEL_GAP
    )
    for ((node, gpu), line), label_y in zip(lines.items(), label_ys, strict=True):
        lx, ly = line[-1]
        parts.append(
            f'<g class="gpu straggler" data-node="{_e(node)}" data-gpu="{gpu}">'
            f'<path d="{_path(line)}" fill="none" stroke="{HIGHLIGHT}" stroke-width="2.5"/>'
            + (f'<line x1="{lx + 2:.1f}" y1="{ly:.1f}" x2="{lx + 6:.1f}" y2="{label_y - 4:.1f}" '
               f'stroke="{HIGHLIGHT}" stroke-width="0.8"/>' if abs(label_y - 4 - ly) > 2 else "")
            + f'<text x="{lx + 8:.1f}" y="{label_y:.1f}" font-size="10" fill="{HIGHLIGHT}" '
            f'font-weight="bold">{_e(node)} GPU {gpu}</text></g>'
        )  # fmt: skip
    parts.append("</svg>")
    return "".join(parts)


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
            alloc = ", ".join(str(a.get("node")) for a in ev.get("allocations") or [])
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
            what = f"node{'s' if len(nodes) > 1 else ''} {', '.join(nodes)} {label}"
        body.append(
            f'<tr class="event {stream}"><td>{_t(ts)}</td><td>{_e(what)}</td>'
            f"<td>{_e(detail[:300])}</td></tr>"
        )
    head = "<tr><th>time</th><th>event</th><th>detail</th></tr>"
    return f'<table class="timeline">{head}{"".join(body)}</table>'


def job_section(
    job_id: str,
    windows: Sequence[Mapping[str, Any]],
    findings: Sequence[Mapping[str, Any]],
    recs: Sequence[Mapping[str, Any]],
    events: Sequence[tuple[str, Mapping[str, Any]]],
    verdict: str = "",
) -> str:
    """One job: the verdict, the charts, its findings, recommendations and timeline."""
    flagged = flagged_gpus(findings)
    names = ", ".join(f"{n} GPU {g}" for n, g in flagged) or "none (job-level findings only)"
    charts = "".join(chart_svg(job_id, s, t, windows, flagged) for s, t in SIGNALS)
    gpus = len({(w["node"], w["gpu_index"]) for w in windows})
    return (
        f'<section class="job" id="job-{_e(job_id)}" data-job="{_e(job_id)}">'
        f"<h2>Job {_e(job_id)}</h2>"
        + (f'<p class="verdict {"bad" if flagged else "ok"}">{_e(verdict)}</p>' if verdict else "")
        + f'<p>{gpus} GPUs. Flagged: <span class="straggler">{_e(names)}</span></p>'
        f'<p class="legend"><span><i class="swatch" style="background:{BAND}"></i>peers p10-p90'
        f'</span><span><i class="swatch" style="background:{MEDIAN}"></i>peer median</span>'
        f'<span><i class="swatch" style="background:{HIGHLIGHT}"></i>flagged GPU</span></p>'
        f'<div class="charts">{charts}</div>'
        f"<h3>Findings</h3>{findings_table(findings)}"
        f"<h3>Recommendations</h3>{recommendations_table(recs)}"
        f"<h3>Timeline</h3>{timeline(events)}</section>"
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
        sections.append(job_section(job, jw, jf, jr, jev, _verdict(job, jw, jf, jr, jev)))
    other = [r for r in recommendations if not set(r.get("job_ids") or []) & set(jobs)]
    span = f"{_t(from_ms)} to {_t(to_ms)} UTC" if from_ms is not None else ""
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{_e(title)}</h1><p>{_e(span)} · {len(jobs)} job(s) with findings · "
        f"{len(findings)} findings · {len(recommendations)} recommendations</p>"
        + "".join(sections)
        + (f"<h2>Other recommendations</h2>{recommendations_table(other)}" if other else "")
        + "</body></html>"
    )


def _verdict(
    job_id: str,
    windows: Sequence[Mapping[str, Any]],
    findings: Sequence[Mapping[str, Any]],
    recs: Sequence[Mapping[str, Any]],
    events: Sequence[tuple[str, Mapping[str, Any]]],
) -> str:
    """The job's one-line verdict, as ``peerwatch job`` says it."""
    from peerwatch.streams.core.job_summary import summarize_job

    return summarize_job(
        job_id, windows, findings, recs,
        [e for s, e in events if s == "job-events"], [e for s, e in events if s == "node-events"],
    ).verdict  # fmt: skip


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
        f"<td>{_t(g.first_flagged_ms)[11:]}"
        f"{f' to {_t(g.cleared_ms)[11:]} (cleared)' if g.cleared_ms else ' (not cleared)'}</td>"
        f"<td>{'<br>'.join(_e(x) for x in g.evidence)}</td><td>{_e(g.node_outcome or '')}</td>"
        "</tr>"
        for g in s.flagged
    )
    flagged_table = (
        '<h2>Flagged GPUs</h2><table class="flagged"><tr><th>GPU</th><th>status</th>'
        "<th>cause</th><th>flagged (UTC)</th><th>evidence</th><th>node</th></tr>"
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
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>peerwatch job {_e(job)}</title><style>{_CSS}</style></head><body>"
        f"<h1>peerwatch job {_e(job)}</h1><p>{_e(who)}</p>"
        f"<p>{s.gpus} GPUs on {len(s.nodes)} nodes · windows {_t(s.first_window_ms)} to "
        f"{_t(s.last_window_ms)[11:]} UTC · {s.windows} GPU windows</p>"
        f'<p class="verdict {"bad" if s.flagged else "ok"}">{_e(s.verdict)}</p>'
        f"{flagged_table}"
        f"<h2>GPUs against their {len(s.rows)} peers</h2>{gpu_table_html(s, shown_rows(s))}"
        f"{section}</body></html>"
    )
