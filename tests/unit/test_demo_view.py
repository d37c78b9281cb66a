from __future__ import annotations

from typing import Any

from peerwatch.demo_view import DemoView, evidence_text


def finding(node: str, gpu: int, status: str, **kw: Any) -> dict[str, Any]:
    return {
        "node": node, "gpu_index": gpu, "job_id": "1001", "status": status, "reason": "r",
        "window_end_ms": 1000, "features": kw.get("features", []),
        "hard_rules": kw.get("hard_rules", []), "windows_flagged": 4, "windows_considered": 6,
    }  # fmt: skip


CLK = [{"feature": "clk", "value": 0.91, "peer_median": 0.99, "mad": 0.009, "z": -6.0},
       {"feature": "sm", "value": 0.9, "peer_median": 0.9, "mad": 0.02, "z": 0.1}]  # fmt: skip
LABELS = [
    {"kind": "fault", "name": "sm_clock_drop", "node": "n1", "gpu_index": 3, "job_id": "1001", "expect": "drain"},
    {"kind": "fault", "name": "thermal_throttle", "node": "n2", "gpu_index": 6, "job_id": "1002", "expect": "straggler"},
    {"kind": "confounder", "name": "checkpoint", "node": None, "gpu_index": None, "job_id": "1001", "expect": "nothing"},
]  # fmt: skip


def test_evidence_lists_only_material_features_and_persistence() -> None:
    text = evidence_text(finding("n1", 3, "CONFIRMED", features=CLK))
    assert "clk 0.910 vs peers 0.990 (z=-6.0)" in text and "sm" not in text
    assert "4/6 windows" in text
    assert "hard: xid_79" in evidence_text(finding("n1", 1, "HARD_ERROR", hard_rules=["xid_79"]))


def test_cleared_gpu_stays_found_but_not_active() -> None:
    view = DemoView()
    view.on_finding(finding("n2", 6, "CONFIRMED", features=CLK))
    view.on_finding(finding("n2", 6, "CLEARED"))
    assert view.flags[("n2", 6)].status == "CLEARED"
    assert "0 now, 1 in all" in view.render()


def test_summary_all_found_nothing_else() -> None:
    view = DemoView()
    view.on_finding(finding("n1", 3, "CONFIRMED", features=CLK))
    view.on_recommendation({"node": "n1", "action": "DRAIN", "severity": "WARNING", "reason": "x"})
    view.on_finding(finding("n2", 6, "SUSPECT", features=CLK))
    text, ok = view.summary(LABELS)
    assert ok, text
    assert "FOUND  sm_clock_drop on n1 gpu3 (job 1001), DRAIN recommended (WARNING)" in text


def test_summary_reports_missed_and_extra() -> None:
    view = DemoView()
    view.on_finding(finding("n9", 0, "SUSPECT", features=CLK))
    text, ok = view.summary(LABELS)
    assert not ok
    assert "MISSED sm_clock_drop on n1 gpu3" in text
    assert "EXTRA  n9 was flagged without an injected fault" in text


def test_job_events_fill_the_jobs_table() -> None:
    view = DemoView()
    view.on_job_event({"job_id": "7", "kind": "STARTED", "user": "u", "job_name": "train",
                       "allocations": [{"node": "a", "gpu_indices": [0, 1]}, {"node": "b", "gpu_indices": [0]}]})  # fmt: skip
    assert view.jobs["7"]["gpus"] == 3 and view.jobs["7"]["nodes"] == 2
    assert "train" in view.render()


def test_idle_follow_up_does_not_hide_the_jobs_finding() -> None:
    view = DemoView()
    view.on_finding(finding("n3", 1, "HARD_ERROR", hard_rules=["xid_79"]))
    later = finding("n3", 1, "HARD_ERROR", hard_rules=["gpu_lost"])
    later["job_id"] = "idle:n3"
    view.on_finding(later)
    assert view.flags[("n3", 1)].job_id == "1001"


def test_hostile_job_and_user_names_are_escaped_in_the_live_view() -> None:
    view = DemoView()
    evil = "\x1b[2J\x1b]0;owned\x07\u202e[bold]x[/bold]"
    view.on_job_event({"job_id": "7\x1b[31m", "kind": "STARTED", "user": "[bold]x[/]", "job_name": evil,
                       "allocations": [{"node": "a", "gpu_indices": [0]}]})  # fmt: skip
    view.on_finding({**finding("n\x1b[2J", 3, "CONFIRMED", features=CLK), "cause": evil})
    for width in (80, 160):
        text = view.render(width)
        assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
        assert max(len(line) for line in text.splitlines()) <= width
    assert "\\x1b[2J" in view.render(200) and "[bold]x[/]" in view.render(200)  # as written
    summary, _ = view.summary(LABELS)
    assert "\x1b" not in summary


def test_flags_and_recommendations_show_one_slowdown_per_gpu() -> None:
    view = DemoView()
    six = [{**CLK[0], "value": 0.93}]  # 6.1% below 0.99 here, 8.1% in the first finding
    view.on_finding(finding("n1", 3, "SUSPECT", features=CLK))
    view.on_finding(finding("n1", 3, "CONFIRMED", features=six))
    view.on_recommendation({"node": "n1", "action": "DRAIN", "severity": "WARNING",
                            "gpu_indices": [3], "reason": "clk -6.1% z=-6.0"})  # fmt: skip
    text = view.render(160)
    assert view.flags[("n1", 3)].slowdown_text == "7.1% slow (SM clock)"
    assert text.count("7.1% slow (SM clock)") == 2  # the flag and the recommendation
    assert "6.1%" not in text and "8.1%" not in text


def test_a_network_fault_is_found_and_named_by_node_and_port() -> None:
    view = DemoView()
    link = {**finding("n4", 0, "HARD_ERROR", hard_rules=["port_down", "link_downed"]),
            "gpu_index": None, "cause": "NETWORK", "port": "mlx5_3/1",
            "reason": "link mlx5_3/1: port_down, link_downed"}  # fmt: skip
    view.on_finding(link)
    view.on_recommendation({"node": "n4", "action": "DRAIN", "severity": "CRITICAL",
                            "reason": "link mlx5_3/1: port_down", "cause": "NETWORK",
                            "port": "mlx5_3/1", "gpu_indices": []})  # fmt: skip
    label = {"kind": "fault", "name": "nic_port_down", "node": "n4", "gpu_index": None,
             "port": "mlx5_3/1", "job_id": "1002", "expect": "drain"}  # fmt: skip
    text, ok = view.summary([label])
    assert ok, text
    assert ("FOUND  nic_port_down on n4 port mlx5_3/1 (job 1002) named port mlx5_3/1, DRAIN "
            "recommended (CRITICAL): hard: port_down, link_downed") in text  # fmt: skip
    screen = view.render(width=160)
    assert "mlx5_3/1" in screen and "network" in screen
