"""``peerwatch job``'s pure core: per-GPU rows against the peers, flagged GPUs, the verdict, and
hostile input (skipped and counted, never raised); the text view."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerwatch.display import is_displayable
from peerwatch.job_view import render_text, shown_rows
from peerwatch.report.job_summary import summarize_job

T0 = 1_767_225_600_000
W = 30_000
NODES = ("n0", "n1")
SLOW = ("n1", 3)
SLOW_FROM = 6  # first slow window
N = 20


def window(node: str, gpu: int, i: int, job: str = "42") -> dict[str, Any]:
    slow = (node, gpu) == SLOW and i >= SLOW_FROM
    return {
        "job_id": job, "node": node, "gpu_index": gpu,
        "window_start_ms": T0 + i * W, "window_end_ms": T0 + (i + 1) * W,
        "clk_ratio": 0.92 if slow else 1.0, "sm_frac": 0.9, "power_w": 500.0 if slow else 600.0,
        "power_ratio": 0.7 if slow else 0.85, "throttle_frac": 0.0, "step_ms": None,
        "score": 6.1 if slow else 0.2, "gated": "warmup" if i < 2 else None,
    }  # fmt: skip


WINDOWS = [window(n, g, i) for i in range(N) for n in NODES for g in range(8)]


def finding(status: str, i: int, cause: str = "CLOCKS", **extra: Any) -> dict[str, Any]:
    return {
        "finding_id": f"f{i}{status}", "job_id": "42", "node": SLOW[0], "gpu_index": SLOW[1],
        "status": status, "window_start_ms": T0 + i * W, "window_end_ms": T0 + (i + 1) * W,
        "first_flagged_ms": T0 + SLOW_FROM * W, "cause": cause, "hard_rules": [],
        "features": [
            {"feature": "clk", "value": 0.92, "peer_median": 1.0, "mad": 0.009, "z": -6.0},
            {"feature": "thr", "value": 0.0, "peer_median": 0.0, "mad": 0.02, "z": 0.0},
        ],
        "reason": f"{status.lower()} slow vs peers: clk -8.0%", "windows_flagged": 4,
        "windows_considered": 6, **extra,
    }  # fmt: skip


FINDINGS = [finding("SUSPECT", SLOW_FROM, "UNKNOWN"), finding("CONFIRMED", SLOW_FROM + 3)]
DRAIN = {"recommendation_id": "r1", "node": SLOW[0], "ts_ms": T0 + 15 * W, "action": "DRAIN",
         "severity": "WARNING", "reason": "straggler", "gpu_indices": [3], "job_ids": ["42"]}  # fmt: skip
JOB_EVENT = {"job_id": "42", "kind": "STARTED", "ts_ms": T0, "user": "alice", "job_name": "llm",
             "account": "ml", "partition": "gpu", "state": "RUNNING", "start_ms": T0,
             "allocations": [{"node": n, "gpu_indices": list(range(8))} for n in NODES]}  # fmt: skip


def test_the_slow_gpu_is_named_with_its_slowdown_duration_cause_and_node_outcome() -> None:
    s = summarize_job("42", WINDOWS, FINDINGS, [DRAIN], [JOB_EVENT])
    assert (s.user, s.name, s.gpus, s.nodes) == ("alice", "llm", 16, ["n0", "n1"])
    [g] = s.flagged
    assert (g.node, g.gpu_index, g.status, g.cause, g.feature) == (
        "n1",
        3,
        "CONFIRMED",
        "CLOCKS",
        "clk",
    )
    # slow windows: those scored >= 3.5, i.e. windows 6..19, each 30 s; 8% below the median
    assert g.slow_s == (N - SLOW_FROM) * 30 and g.slow_frac == pytest.approx(0.08)
    assert g.first_flagged_ms == T0 + SLOW_FROM * W and g.cleared_ms is None
    assert g.node_outcome == "node drain recommended" and g.node_outcome_ms == DRAIN["ts_ms"]
    assert g.evidence == ["latest evidence: SM clock 0.920 vs peers 1.000 (z=-6.0)"]
    assert s.verdict == (
        "GPU 3 on n1 ran 8.0% slow (SM clock) for 7 min; cause CLOCKS; node drain recommended"
    )


def test_a_drain_seen_on_the_node_says_drained_and_an_unnamed_cause_says_so() -> None:
    drained = {"node": "n1", "ts_ms": T0 + 16 * W, "state": "MIXED", "flags": ["DRAIN"]}
    before = {"node": "n1", "ts_ms": T0, "state": "MIXED", "flags": ["DRAIN"]}  # older: not ours
    fs = [finding("CONFIRMED", 9, "UNKNOWN")]
    s = summarize_job("42", WINDOWS, fs, [DRAIN], [JOB_EVENT], [before, drained])
    assert s.flagged[0].node_outcome == "node drained"
    assert s.flagged[0].node_outcome_ms == T0 + 16 * W
    assert s.verdict.endswith("cause not named; node drained")


def test_rows_compare_every_gpu_with_the_per_window_peer_median() -> None:
    s = summarize_job("42", WINDOWS, FINDINGS)
    rows = {(r.node, r.gpu_index): r for r in s.rows}
    assert len(rows) == 16
    slow = rows[SLOW]
    used = N - 2  # the two gated (warm-up) windows are left out
    assert slow.windows == used
    slow_windows = N - SLOW_FROM
    assert slow.values["clk"] == pytest.approx((0.92 * slow_windows + (used - slow_windows)) / used)
    assert slow.vs_peers["clk"] == pytest.approx(-0.08 * slow_windows / used)
    assert slow.vs_peers["thr"] == 0.0 and slow.values["step"] is None
    assert slow.status == "CONFIRMED" and rows[("n0", 0)].status is None
    assert rows[("n0", 0)].vs_peers["clk"] == pytest.approx(0.0)
    assert s.peers["clk"][1] == pytest.approx(1.0) and s.peers["power"][1] == pytest.approx(600.0)
    assert (s.windows, s.gated_windows) == (N * 16, 2 * 16)


def test_no_flagged_gpu_and_job_level_findings() -> None:
    quiet = [w for w in WINDOWS if (w["node"], w["gpu_index"]) != SLOW]
    s = summarize_job("42", quiet, [], [], [JOB_EVENT])
    assert s.verdict == "job 42: no GPU stood out from its 15 peers over 10 min"
    wide = {**finding("JOB_WIDE", 5), "node": None, "gpu_index": None}
    s = summarize_job("42", quiet, [wide])
    assert s.flagged == [] and s.job_findings == {"JOB_WIDE": 1}
    assert "1 job-level finding(s) (1 JOB_WIDE): a shared cause, no GPU blamed" in s.verdict
    assert summarize_job("7").verdict == "job 7: no GPU windows or findings found for this job"


def test_hard_error_comes_first_and_others_are_counted() -> None:
    hard = {**finding("HARD_ERROR", 12, "HARDWARE"), "node": "n0", "gpu_index": 1,
            "hard_rules": ["xid_79"], "features": []}  # fmt: skip
    s = summarize_job("42", WINDOWS, [*FINDINGS, hard])
    assert [(g.node, g.status) for g in s.flagged] == [("n0", "HARD_ERROR"), ("n1", "CONFIRMED")]
    assert s.verdict.startswith("GPU 1 on n0 hit a hard error (xid_79); cause HARDWARE")
    assert s.verdict.endswith("(+1 more flagged GPU(s))")


def test_cleared_and_throttle_wording() -> None:
    thr = [{**finding("CONFIRMED", 8, "THERMAL"), "features": [
        {"feature": "thr", "value": 0.6, "peer_median": 0.0, "mad": 0.02, "z": 20.0}]}]  # fmt: skip
    ws = [{**w, "throttle_frac": 0.6} if (w["node"], w["gpu_index"]) == SLOW
          and w["window_start_ms"] >= T0 + SLOW_FROM * W else w for w in WINDOWS]  # fmt: skip
    cleared = finding("CLEARED", 19, "UNKNOWN")
    s = summarize_job("42", ws, [*thr, cleared])
    assert s.flagged[0].cleared_ms == T0 + 20 * W
    assert "was throttled 60 points more than its peers for" in s.verdict
    assert "cause THERMAL" in s.verdict
    assert s.flagged[0].evidence == ["latest evidence: throttling 0.600 vs peers 0.000 (z=+20.0)"]


def test_other_jobs_records_are_ignored_and_expired_windows_fall_back_to_the_findings() -> None:
    other = [window(n, g, i, job="43") for i in range(3) for n in NODES for g in range(8)]
    s = summarize_job("42", other, FINDINGS, [{**DRAIN, "job_ids": ["43"]}])
    assert s.rows == [] and s.windows == 0
    [g] = s.flagged  # no windows left: duration and size from the findings themselves
    assert g.slow_frac == pytest.approx(0.08) and g.slow_s == (SLOW_FROM + 4 - SLOW_FROM) * 30
    assert g.node_outcome is None and s.skipped == {}


BAD: list[Any] = [
    None, "window", 7, [], {"job_id": "42"},
    {**WINDOWS[0], "node": None}, {**WINDOWS[0], "gpu_index": "3"},
    {**WINDOWS[0], "window_start_ms": "soon"}, {**WINDOWS[0], "gpu_index": True},
]  # fmt: skip


def test_hostile_records_are_skipped_and_counted() -> None:
    nan = {**WINDOWS[40], "clk_ratio": float("nan"), "power_w": float("inf")}
    bad_findings: list[Any] = [
        None, {**FINDINGS[1], "features": "clk"}, {**FINDINGS[1], "status": None},
        {**FINDINGS[1], "window_start_ms": None}, {**FINDINGS[1], "features": [1, 2]},
    ]  # fmt: skip
    s = summarize_job(
        "42", [*WINDOWS, *BAD, nan], [*FINDINGS, *bad_findings], [None, {"node": 3}],
        [None, {"job_id": "42", "ts_ms": T0, "allocations": "n0"}], ["x"], [{}],
    )  # fmt: skip
    assert s.skipped == {
        "drain action: not a record with a node": 1,
        "finding: features not a list of records": 2, "finding: not a record": 1,
        "finding: status missing": 1, "finding: window_start_ms not an integer": 1,
        "job event: allocations not a list": 1, "job event: not a record with a time": 1,
        "node event: not a record with a node": 1, "recommendation: not a record with a node": 2,
        "window: gpu_index not an integer": 2, "window: node missing": 1,
        "window: not a record": 4, "window: window_start_ms not an integer": 2,
    }  # fmt: skip
    assert s.flagged[0].node == "n1"  # the good records still make the summary
    json.dumps(s.to_json())  # NaN/inf were dropped: valid JSON


record = st.dictionaries(
    st.sampled_from(["job_id", "node", "gpu_index", "window_start_ms", "window_end_ms", "status",
                     "features", "hard_rules", "score", "clk_ratio", "gated", "first_flagged_ms",
                     "allocations", "ts_ms", "job_ids", "action", "flags", "state", "cause"]),
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=5),
              st.just("42"), st.lists(st.one_of(st.integers(), st.text(max_size=3),
                                                st.dictionaries(st.text(max_size=8), st.floats()))))
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.lists(st.one_of(record, st.none(), st.integers()), max_size=8))
def test_any_input_gives_a_summary_never_an_exception(records: list[Any]) -> None:
    s = summarize_job("42", records + WINDOWS[:16], records, records, records, records, records)
    assert s.verdict and isinstance(s.skipped, dict)
    json.dumps(s.to_json())


def test_text_view_colours_only_when_asked_and_shows_flagged_then_slowest() -> None:
    s = summarize_job("42", WINDOWS, FINDINGS, [DRAIN], [JOB_EVENT])
    plain = render_text(s)
    assert "\x1b[" not in plain
    assert "Verdict: GPU 3 on n1 ran 8.0% slow" in plain
    assert "CONFIRMED  n1 GPU 3  cause CLOCKS" in plain
    assert "node drain recommended at 00:07:30" in plain
    assert "peers median" in plain and "flagged and the 5 slowest" in plain
    coloured = render_text(s, colour=True)
    assert "\x1b[31m" in coloured and coloured.count("\n") == plain.count("\n")
    rows = shown_rows(s)
    assert (rows[0].node, rows[0].gpu_index) == SLOW and len(rows) == 6
    assert len(shown_rows(s, all_gpus=True)) == 16
    everything = render_text(s, all_gpus=True)
    assert "GPUs against their 16 peers (all)" in everything


def test_one_slowdown_figure_in_the_verdict_the_flagged_block_and_nowhere_else() -> None:
    # Two findings whose evidence says 8% and 6% below the peers: the slowdown is their mean, 7%,
    # and it is the only percentage about that GPU outside the job-mean table.
    six = {**finding("CONFIRMED", SLOW_FROM + 5), "features": [
        {"feature": "clk", "value": 0.94, "peer_median": 1.0, "mad": 0.009, "z": -5.0}]}  # fmt: skip
    s = summarize_job("42", WINDOWS, [*FINDINGS, six], [DRAIN], [JOB_EVENT])
    assert s.flagged[0].slow_frac == pytest.approx((0.08 + 0.08 + 0.06) / 3)
    text = render_text(s, width=160)
    assert "ran 7.3% slow (SM clock)" in s.verdict and "slowdown: 7.3% slow (SM clock)" in text
    above_table = text.split("GPUs against their")[0]
    assert set(re.findall(r"\d+\.\d+%", above_table)) == {"7.3%"}


HOSTILE_NAMES = [
    "\x1b[2J\x1b[Hcleared",  # clear the screen
    "\x1b]0;pwned\x07title",  # set the window title
    "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\",  # OSC 8 hyperlink
    "safe\u202egnp.exe",  # right-to-left override
    "[bold red]markup[/] [link=https://evil.example]x[/link]",  # rich markup
    "\x9b31mC1 CSI",  # an 8-bit CSI
    "x" * 5000,
]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
@pytest.mark.parametrize("colour", [False, True])
def test_hostile_job_names_reach_the_terminal_escaped(name: str, colour: bool) -> None:
    event = {**JOB_EVENT, "job_name": name, "user": name, "account": name}
    findings = [{**f, "cause": name} for f in FINDINGS]
    windows = [{**w, "node": name[:60]} if w["node"] == "n0" else w for w in WINDOWS]
    s = summarize_job("42", windows, findings, [DRAIN], [event])
    text = render_text(s, colour=colour, width=120)
    if colour:  # only the view's own SGR colour codes: ESC [ digits m
        text = re.sub("\x1b\\[[0-9;]*m", "", text)
    assert not is_displayable(name) or "markup" in name or "x" * 100 in name
    assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text
    assert "\u202e" not in text
    assert max(len(line) for line in text.splitlines()) <= 120
    if "markup" in name:  # rich markup shown as written, not interpreted
        assert "[bold red]markup[/]" in text
    assert len(text) < 5000  # every field capped for display (the 5,000-character name too)


def test_the_table_fits_80_columns() -> None:
    s = summarize_job("42", WINDOWS, FINDINGS, [DRAIN], [JOB_EVENT])
    text = render_text(s, width=80)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "peers median" in text and "n1" in text
