"""The incident report's HTML: structure (parsed), highlight, evidence, timeline, self-contained."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from typing import Any

import pytest

from peerwatch.exporters.report import (
    chart_html,
    flagged_gpus,
    hostlist,
    peer_band,
    quantile,
    render_report,
)
from peerwatch.exporters.report_charts import chart_data, json_for_script, y_range

T0 = 1_767_225_600_000


def window(node: str, gpu: int, i: int, clk: float) -> dict[str, Any]:
    return {"job_id": "42", "node": node, "gpu_index": gpu, "window_start_ms": T0 + i * 30_000,
            "clk_ratio": clk, "throttle_frac": 0.0, "sm_frac": 0.9, "power_ratio": 0.8}  # fmt: skip


WINDOWS = [
    window(node, g, i, 0.91 if (node, g) == ("n1", 3) and i >= 4 else 0.99 + 0.001 * g)
    for i in range(12) for node in ("n0", "n1") for g in range(4)
]  # fmt: skip
FINDING = {
    "finding_id": "f-1", "job_id": "42", "node": "n1", "gpu_index": 3, "status": "CONFIRMED",
    "window_start_ms": T0 + 8 * 30_000, "window_end_ms": T0 + 9 * 30_000, "reason": "slow <clk>",
    "features": [{"feature": "clk", "value": 0.91, "peer_median": 0.99, "mad": 0.01, "z": -6.1}],
    "hard_rules": [], "windows_flagged": 4, "windows_considered": 6,
}  # fmt: skip
JOB_WIDE = {**FINDING, "finding_id": "f-2", "node": None, "gpu_index": None, "status": "JOB_WIDE"}
REC = {
    "recommendation_id": "r-1", "node": "n1", "ts_ms": T0 + 9 * 30_000, "action": "DRAIN",
    "severity": "WARNING", "reason": "straggler gpu3", "gpu_indices": [3], "job_ids": ["42"],
    "evidence": [{"kind": "straggler", "detail": "confirmed 4/6"}],
}  # fmt: skip
EVENTS = [
    ("job-events", {"job_id": "42", "kind": "STARTED", "ts_ms": T0,
                    "allocations": [{"node": "n0"}, {"node": "n1"}]}),
    ("node-events", {"node": "n0", "state": "ALLOCATED", "ts_ms": T0, "reason": None}),
    ("node-events", {"node": "n1", "state": "ALLOCATED", "ts_ms": T0, "reason": None}),
    ("node-events", {"node": "n9", "state": "DRAIN", "ts_ms": T0, "reason": "other job's node"}),
]  # fmt: skip


class Dom(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def find(self, tag: str, **attrs: str) -> list[dict[str, str]]:
        return [a for t, a in self.tags if t == tag and all(a.get(k.replace("_", "-")) == v
                                                            for k, v in attrs.items())]  # fmt: skip


@pytest.fixture(scope="module")
def page() -> str:
    return render_report(
        WINDOWS, [FINDING, JOB_WIDE], [REC], EVENTS, from_ms=T0, to_ms=T0 + 3_600_000
    )


@pytest.fixture(scope="module")
def dom(page: str) -> Dom:
    d = Dom()
    d.feed(page)
    return d


def charts_of(page: str) -> list[dict[str, Any]]:
    """The data of every chart on the page (the JSON each chart div holds)."""
    found = re.findall(r'<div class="chart"[^>]*><script type="application/json">(.*?)</script>',
                       page)  # fmt: skip
    return [json.loads(x) for x in found]


def test_one_section_per_job_with_four_charts(dom: Dom, page: str) -> None:
    assert len(dom.find("section", data_job="42")) == 1
    charts = dom.find("div", data_job="42")
    assert [c["data-signal"] for c in charts] == [
        "clk_ratio",
        "throttle_frac",
        "sm_frac",
        "power_ratio",
    ]
    assert [c["signal"] for c in charts_of(page)] == [c["data-signal"] for c in charts]


def test_the_straggler_is_a_red_line_over_the_peer_band_with_real_times(page: str) -> None:
    clk = charts_of(page)[0]
    assert [g["label"] for g in clk["gpus"]] == ["n1 GPU 3"]  # healthy GPUs live in the band
    assert clk["x"][0] == T0 / 1000 and len(clk["x"]) == 12  # epoch seconds: real time ticks
    assert clk["gpus"][0]["values"][4:] == [0.91] * 8
    assert len(clk["p10"]) == len(clk["median"]) == len(clk["p90"]) == 12
    # The axis leaves room under the straggler: 0.91 is not the bottom of the chart.
    lo, hi = clk["y"]
    assert lo < 0.91 - 0.02 and hi >= 0.993
    assert "uPlot" in page and "drag to zoom" in page


def test_findings_and_recommendations_with_evidence(dom: Dom) -> None:
    text = "".join(dom.text)
    assert dom.find("tr", data_finding_id="f-1") and dom.find("tr", data_finding_id="f-2")
    assert dom.find("tr", data_recommendation_id="r-1")
    assert "clk=0.910 (peers 0.990, z=-6.1)" in text
    assert "straggler: confirmed 4/6" in text
    assert "slow <clk>" in text  # escaped in the source, intact as text


def test_timeline_groups_node_events_and_keeps_only_the_jobs_nodes(dom: Dom) -> None:
    text = "".join(dom.text)
    assert "job 42 STARTED" in text
    assert "nodes n[0-1] ALLOCATED" in text
    assert "n9" not in text


def test_page_is_self_contained(page: str) -> None:
    lowered = page.lower()
    for needle in ("<link", " src=", "@import", "url(", "<img", "fetch(", "xmlhttprequest"):
        assert needle not in lowered
    # The only address on the page is uPlot's own banner comment.
    assert re.findall(r"https?://[^\s\"'*]+", page) == ["https://github.com/leeoniya/uPlot"]
    assert len(page) < 120_000


def test_no_findings_no_sections() -> None:
    d = Dom()
    d.feed(render_report(WINDOWS, [], [], EVENTS))
    assert d.find("section") == [] and "0 job(s) with findings" in "".join(d.text)


def test_band_quantiles_and_downsampling() -> None:
    assert quantile([0.0, 10.0], 0.1) == pytest.approx(1.0)
    band = peer_band(WINDOWS, "clk_ratio")
    assert len(band) == 12
    start, p10, med, p90 = band[-1]
    assert start == T0 + 11 * 30_000 and p10 < med <= p90
    long = [(T0 + i * 1000, 0.9, float(i), 1.0) for i in range(1000)]
    data = chart_data("42", "clk_ratio", "clk", long, {("n1", 3): {T0: 0.5}}, max_points=100)
    assert data is not None and len(data["x"]) == len(data["median"]) == 100
    assert data["median"][0] == pytest.approx(4.5)  # buckets of 10 averaged
    assert data["gpus"][0]["values"][0] == 0.5 and data["gpus"][0]["values"][1] is None
    assert flagged_gpus([FINDING, JOB_WIDE, FINDING]) == [("n1", 3)]


def test_a_throttle_chart_with_nothing_throttled_has_a_real_axis_and_says_so() -> None:
    assert y_range("throttle_frac", [0.0, 0.0]) == (0.0, 0.1)
    assert y_range("clk_ratio", [1.0, 1.0]) == pytest.approx((0.98, 1.0))
    # A real spread gets room below its lowest value (half the span) and a little above.
    assert y_range("clk_ratio", [0.9, 0.99]) == pytest.approx((0.855, 0.999))
    html = chart_html("42", "throttle_frac", "throttled share", WINDOWS, [("n1", 3)])
    assert "nothing throttled" in html
    assert "nothing throttled" not in chart_html("42", "clk_ratio", "clk", WINDOWS, [("n1", 3)])


def test_chart_data_cannot_close_its_script_and_skips_non_finite_values() -> None:
    evil = "</script><script>alert(1)</script>\u202e"
    ws = [{**w, "node": evil} if w["node"] == "n1" else w for w in WINDOWS]
    ws.append({**WINDOWS[0], "clk_ratio": float("nan")})
    html = chart_html("42", "clk_ratio", "clk", ws, [(evil, 3)])
    assert "</script><script>" not in html and "\u202e" not in html
    assert "\\u003c/script\\u003e" in html
    assert json_for_script({"a": "<&>"}) == '{"a":"\\u003c\\u0026\\u003e"}'


def test_node_lists_are_slurm_hostlists(dom: Dom) -> None:
    assert hostlist([f"gpu{i:05d}" for i in range(32)]) == "gpu[00000-00031]"
    assert hostlist(["a,b", "c"]) == "a,b, c"  # a name a hostlist cannot hold is listed
    text = "".join(dom.text)
    assert "nodes n[0-1] ALLOCATED" in text and "8 GPUs on n[0-1]" in text


def test_each_finding_gets_plain_advice(dom: Dom) -> None:
    text = "".join(dom.text)
    assert "What to do" in text
    assert "GPU 3 on n1 ran 8.1% slow (SM clock)" in text
    assert "resubmit with --exclude=n1" in text


def test_each_job_section_opens_with_its_verdict(dom: Dom) -> None:
    [verdict] = [a for t, a in dom.tags if t == "p" and "verdict" in a.get("class", "")]
    assert "bad" in verdict["class"]
    assert "GPU 3 on n1 ran" in "".join(dom.text)


def test_job_page_has_verdict_flagged_gpus_table_and_the_jobs_section() -> None:
    from peerwatch.exporters.report import render_job_report
    from peerwatch.report.job_summary import summarize_job

    jobs = [e for s, e in EVENTS if s == "job-events"]
    summary = summarize_job("42", WINDOWS, [FINDING], [REC], jobs)
    page = render_job_report(summary, WINDOWS, [FINDING], [REC], EVENTS)
    d = Dom()
    d.feed(page)
    text = "".join(d.text)
    assert summary.verdict in text and "peerwatch job 42" in text
    assert d.find("tr", **{"class": "flagged-gpu"}, data_node="n1", data_gpu="3")
    assert d.find("tr", **{"class": "gpu flagged"}, data_node="n1", data_gpu="3")
    assert len(d.find("tr", **{"class": "peers"})) == 3
    assert len(d.find("div", data_job="42")) == 4 and d.find("section", data_job="42")
    assert "n9" not in text  # node events of other nodes stay out
    assert "recommended for draining; if the job is still running slow" in text
    assert f"{summary.flagged[0].slow_frac * 100:.1f}% slow (SM clock)" in text  # the one figure
