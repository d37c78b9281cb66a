"""The report's interactive charts: uPlot (vendored in ``exporters/vendor/uplot``, MIT) inlined
into the page, so a report opened offline or attached to a ticket still draws.

Each chart is a ``<div class="chart">`` holding its data as JSON (``<script
type="application/json">``): time in epoch seconds, the peers' p10, median and p90 per window
and every flagged GPU's values on the same times. One small script (:data:`CHART_SCRIPT`)
draws them all: the p10-p90 band, the median, the flagged GPUs in red; hover shows every value
at that time, drag on the plot zooms the time axis (double click resets), the time axis has
real UTC ticks, and the y axis leaves room below the lowest line (:func:`y_range`), so an 8%
drop does not look like a fall to zero.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import resources
from typing import Any

from peerwatch.display import display_text

HIGHLIGHT = "#d62728"
BAND = "#c6dbef"
BAND_EDGE = "#9ecae1"
MEDIAN = "#4a5568"

#: Per signal: the smallest y span a chart shows, and the bounds no axis goes beyond (so a job
#: whose values all agree gets a meaningful axis, not one 0.1 wide around the value).
_Y_SPAN: dict[str, tuple[float, float, float]] = {
    "clk_ratio": (0.02, 0.0, 1.0),
    "throttle_frac": (0.1, 0.0, 1.0),
    "sm_frac": (0.1, 0.0, 1.0),
    "power_ratio": (0.1, 0.0, 2.0),
}
#: Signals shown in percent.
_PERCENT = ("throttle_frac", "sm_frac")
#: The room left below the lowest value, as a share of the values' span: the lowest line sits
#: a third of the way up, not on the axis.
_ROOM_BELOW = 0.5
_ROOM_ABOVE = 0.1


def y_range(signal: str, values: Sequence[float]) -> tuple[float, float]:
    """The chart's y axis for ``values`` of ``signal``: their range widened to the signal's
    smallest span, with room below the lowest value (half the span) and a little above, kept
    within the signal's bounds. A share that is all zero (nothing throttled) gets
    ``[0, span]``."""
    lo, hi = min(values), max(values)
    min_span, floor, ceil = _Y_SPAN.get(signal, (1e-6, -math.inf, math.inf))
    if hi - lo < min_span:
        mid = (lo + hi) / 2
        lo, hi = mid - min_span / 2, mid + min_span / 2
    span = hi - lo
    lo, hi = max(floor, lo - _ROOM_BELOW * span), min(ceil, hi + _ROOM_ABOVE * span)
    if hi - lo < min_span:  # pressed against a bound: keep the smallest span inside it
        lo, hi = (floor, floor + min_span) if lo <= floor else (ceil - min_span, ceil)
    return lo, hi


def _bucketed(values: Sequence[float | None], size: float, n: int) -> list[float | None]:
    out: list[float | None] = []
    for i in range(n):
        chunk = [v for v in values[int(i * size) : int((i + 1) * size)] if v is not None]
        out.append(sum(chunk) / len(chunk) if chunk else None)
    return out


def chart_data(
    job_id: str,
    signal: str,
    title: str,
    band: Sequence[tuple[int, float, float, float]],
    gpus: Mapping[tuple[str, int], Mapping[int, float]],
    max_points: int = 600,
) -> dict[str, Any] | None:
    """One chart's data: ``band`` is (window start ms, p10, median, p90) per window, ``gpus``
    each flagged GPU's value per window start. At most ``max_points`` times: consecutive
    windows averaged in equal buckets. None without a band."""
    if not band:
        return None
    xs = [b[0] / 1000 for b in band]
    cols: list[list[float | None]] = [[b[i] for b in band] for i in (1, 2, 3)]
    lines = [[series.get(b[0]) for b in band] for series in gpus.values()]
    if len(xs) > max_points:
        size = len(xs) / max_points
        xs = [xs[int(i * size)] for i in range(max_points)]
        cols = [_bucketed(c, size, max_points) for c in cols]
        lines = [_bucketed(line, size, max_points) for line in lines]
    values = [v for c in (cols[0], cols[2], *lines) for v in c if v is not None]
    lo, hi = y_range(signal, values)
    return {
        "job": display_text(job_id),
        "signal": signal,
        "title": display_text(title),
        "percent": signal in _PERCENT,
        "x": xs,
        "p10": cols[0],
        "median": cols[1],
        "p90": cols[2],
        "gpus": [
            {"label": display_text(f"{node} GPU {gpu}"), "values": line}
            for (node, gpu), line in zip(gpus, lines, strict=True)
        ],
        "y": [lo, hi],
        "nothing": signal == "throttle_frac" and max(abs(v) for v in values) < 1e-9,
    }


def json_for_script(doc: Any) -> str:
    """``doc`` as JSON safe inside an HTML ``<script>``: ``<``, ``>`` and ``&`` as ``\\u``
    escapes, so no value can close the script element."""
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def chart_div(data: Mapping[str, Any]) -> str:
    """The chart's element: a div with its data; :data:`CHART_SCRIPT` draws it."""
    from html import escape

    note = '<p class="note">nothing throttled (all GPUs at 0%)</p>' if data.get("nothing") else ""
    return (
        f'<div class="chart" data-job="{escape(data["job"])}" data-signal="{data["signal"]}">'
        f'<script type="application/json">{json_for_script(data)}</script>{note}</div>'
    )


@cache
def _vendored(name: str) -> str:
    return (resources.files("peerwatch.exporters") / "vendor" / "uplot" / name).read_text()


def chart_head() -> str:
    """uPlot's stylesheet, for the page's ``<head>``."""
    return f"<style>{_vendored('uPlot.min.css')}</style>"


CHART_SCRIPT = """
(function () {
  var C = __COLOURS__, HIGHLIGHT = C.highlight, BAND = C.band, EDGE = C.edge, MEDIAN = C.median;
  var utc = function (ts) { return uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"); };
  document.querySelectorAll("div.chart[data-signal]").forEach(function (el) {
    var d = JSON.parse(el.querySelector("script").textContent);
    var fmt = function (u, v) {
      return v == null ? "-" : d.percent ? (v * 100).toFixed(1) + "%" : v.toFixed(3);
    };
    var tick = function (u, vals) {
      return vals.map(function (v) {
        return d.percent ? (v * 100).toFixed(0) + "%" : v.toPrecision(3);
      });
    };
    // 24-hour UTC ticks: seconds only where a tick is not on a whole minute, the date past a day.
    var clock = function (u, vals) {
      var span = vals.length > 1 ? vals[vals.length - 1] - vals[0] : 0;
      var secs = vals.some(function (v) { return v % 60 !== 0; });
      return vals.map(function (v) {
        var iso = new Date(v * 1e3).toISOString();
        var t = secs ? iso.substr(11, 8) : iso.substr(11, 5);
        return span > 86400 ? iso.substr(5, 5) + " " + t : t;
      });
    };
    var series = [{label: "time (UTC)", value: function (u, v) {
      return v == null ? "-" : new Date(v * 1e3).toISOString().substr(0, 19).replace("T", " ");
    }},
      {label: "peers p10", stroke: EDGE, width: 1, value: fmt},
      {label: "peer median", stroke: MEDIAN, width: 1.5, value: fmt},
      {label: "peers p90", stroke: EDGE, width: 1, value: fmt}];
    var data = [d.x, d.p10, d.median, d.p90];
    d.gpus.forEach(function (g) {
      series.push({label: g.label, stroke: HIGHLIGHT, width: 2.5, value: fmt});
      data.push(g.values);
    });
    new uPlot({
      title: d.title, width: 620, height: 240, tzDate: utc,
      scales: {x: {time: true}, y: {range: function () { return d.y; }}},
      series: series, bands: [{series: [3, 1], fill: BAND}],
      axes: [{label: "UTC", values: clock}, {values: tick, size: 56}],
      cursor: {drag: {x: true, y: false}, sync: {key: "job-" + d.job}},
      legend: {live: true}
    }, data, el);
  });
})();
""".replace(
    "__COLOURS__",
    json.dumps({"highlight": HIGHLIGHT, "band": BAND, "edge": BAND_EDGE, "median": MEDIAN}),
)


def chart_scripts() -> str:
    """uPlot and the drawing script, for the end of the page's ``<body>``."""
    return f"<script>{_vendored('uPlot.iife.min.js')}</script><script>{CHART_SCRIPT}</script>"
