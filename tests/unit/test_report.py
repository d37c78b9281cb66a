"""The incident report's HTML: structure (parsed), highlight, evidence, timeline, self-contained."""

from __future__ import annotations

from html.parser import HTMLParser
from typing import Any

import pytest

from peerwatch.exporters.report import (
    HIGHLIGHT,
    downsample,
    flagged_gpus,
    peer_band,
    quantile,
    render_report,
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
