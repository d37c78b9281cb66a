"""The incident report's HTML: structure (parsed), highlight, evidence, timeline, self-contained."""

from __future__ import annotations

import itertools
from html.parser import HTMLParser
from typing import Any

import pytest

from peerwatch.exporters.report import (
    HIGHLIGHT,
    chart_svg,
    downsample,
    flagged_gpus,
    peer_band,
    quantile,
    render_report,
    spread_labels,
    y_range,
)

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


def test_one_section_per_job_with_four_charts(dom: Dom) -> None:
    assert len(dom.find("section", data_job="42")) == 1
    charts = dom.find("svg", data_job="42")
    assert [c["data-signal"] for c in charts] == [
        "clk_ratio",
        "throttle_frac",
        "sm_frac",
        "power_ratio",
    ]


def test_the_straggler_is_drawn_in_the_highlight_colour_and_labelled(dom: Dom, page: str) -> None:
    groups = dom.find("g", data_node="n1", data_gpu="3")
    assert len(groups) == 4 and all("straggler" in g["class"] for g in groups)
    assert [a for t, a in dom.tags if t == "path" and a.get("stroke") == HIGHLIGHT]
    assert "n1 GPU 3" in "".join(dom.text)
    assert not dom.find("g", data_node="n0")  # healthy GPUs live in the band, not as lines


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
    assert "nodes n0, n1 ALLOCATED" in text
    assert "n9" not in text


def test_page_is_self_contained(page: str) -> None:
    lowered = page.lower()
    for needle in ("<script", "<link", "http://", "https://", "@import", "url(", "<img"):
        assert needle not in lowered
    assert len(page) < 60_000


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
    pts = [(i, float(i)) for i in range(1000)]
    small = downsample(pts, 100)
    assert len(small) == 100 and small[0][1] == pytest.approx(4.5)
    assert flagged_gpus([FINDING, JOB_WIDE, FINDING]) == [("n1", 3)]


def _label_ys(svg: str) -> list[float]:
    d = Dom()
    d.feed(svg)
    return [float(a["y"]) for t, a in d.tags if t == "text" and a.get("font-weight") == "bold"
            and a.get("fill") == HIGHLIGHT]  # fmt: skip


def test_labels_of_several_flagged_gpus_never_overlap_and_stay_in_the_chart() -> None:
    # Three flagged GPUs that end at the same value: their labels would sit on one line.
    slow = {("n0", 1), ("n0", 2), ("n1", 3)}
    ws = [window(n, g, i, 0.91 if (n, g) in slow else 0.99) for i in range(12)
          for n in ("n0", "n1") for g in range(4)]  # fmt: skip
    svg = chart_svg("42", "clk_ratio", "SM clock / max", ws, sorted(slow))
    ys = sorted(_label_ys(svg))
    assert len(ys) == 3
    assert all(b - a >= 11 for a, b in itertools.pairwise(ys))
    assert all(0 < y <= 170 for y in ys)
    placed = spread_labels([100.0, 100.0, 100.0, 10.0], top=8, bottom=160, gap=11)
    assert placed[3] == 10.0 and sorted(placed[:3]) == [100.0, 111.0, 122.0]
    crowded = spread_labels([158.0] * 5, top=8, bottom=160, gap=11)  # stack shifted up to fit
    assert max(crowded) == 160.0 and min(crowded) == 116.0


def test_a_throttle_chart_with_nothing_throttled_has_a_real_axis_and_says_so(dom: Dom) -> None:
    assert y_range("throttle_frac", [0.0, 0.0]) == (0.0, 0.1)
    assert y_range("clk_ratio", [1.0, 1.0]) == pytest.approx((0.98, 1.0))
    assert y_range("clk_ratio", [0.9, 0.99]) == (0.9, 0.99)  # a real spread is kept
    svg = chart_svg("42", "throttle_frac", "throttled share", WINDOWS, [("n1", 3)])
    assert "nothing throttled" in svg and ">10%<" in svg and ">0%<" in svg
    assert "-0.05" not in svg
    assert "nothing throttled" not in chart_svg("42", "clk_ratio", "clk", WINDOWS, [("n1", 3)])


def test_each_job_section_opens_with_its_verdict(dom: Dom) -> None:
    [verdict] = [a for t, a in dom.tags if t == "p" and "verdict" in a.get("class", "")]
    assert "bad" in verdict["class"]
    assert "GPU 3 on n1 ran" in "".join(dom.text)


def test_job_page_has_verdict_flagged_gpus_table_and_the_jobs_section() -> None:
    from peerwatch.exporters.report import render_job_report
    from peerwatch.streams.core.job_summary import summarize_job

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
    assert len(d.find("svg", data_job="42")) == 4 and d.find("section", data_job="42")
    assert "n9" not in text  # node events of other nodes stay out
    lowered = page.lower()
    assert "<script" not in lowered and "http" not in lowered
