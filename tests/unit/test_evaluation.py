"""Metric arithmetic of the evaluation harness on hand-made labels, findings and drains."""

from __future__ import annotations

from typing import Any

import pytest

from peerwatch.errors import ConfigError
from peerwatch.streams.tools.eval_suites import suite
from peerwatch.streams.tools.evaluation import (
    Score,
    kind_of,
    latency_summary,
    parse_overrides,
    percentile,
    score,
    targets,
)

S = 1000
W = 30 * S


def label(name: str, node: str, gpu: int | None, start_s: int, end_s: int, expect: str,
          kind: str = "fault", **params: Any) -> dict[str, Any]:  # fmt: skip
    return {"kind": kind, "name": name, "node": node, "gpu_index": gpu, "job_id": "1",
            "start_ms": start_s * S, "end_ms": end_s * S, "expect": expect, "params": params}  # fmt: skip


def finding(
    status: str, node: str, gpu: int | None, start_s: int, first_s: int | None = None
) -> dict[str, Any]:
    return {"finding_id": f"{status}{node}{gpu}{start_s}", "job_id": "1", "node": node,
            "gpu_index": gpu, "status": status, "window_start_ms": start_s * S,
            "window_end_ms": start_s * S + W, "first_flagged_ms": (first_s or start_s) * S}  # fmt: skip


def rec(action: str, node: str, ts_s: int, reason: str = "x") -> dict[str, Any]:
    return {"recommendation_id": f"{action}{node}{ts_s}", "node": node, "ts_ms": ts_s * S,
            "action": action, "reason": reason}  # fmt: skip


def test_recall_precision_latency_and_false_drains() -> None:
    labels = [
        label("sm_clock_drop", "a", 1, 100, 400, "straggler", pct=8),  # found 50 s after onset
        label("sm_clock_drop", "b", 2, 100, 400, "straggler", pct=5),  # missed
        label("thermal_throttle", "c", 0, 100, 1000, "drain"),  # finding + drain
        label("xid", "d", 3, 200, 1200, "drain", xid=48),  # hard, drained within a window
        label("checkpoint", "a", None, 500, 560, "nothing", kind="confounder"),
    ]
    findings = [
        (finding("SUSPECT", "a", 1, 120), 150 * S),
        (finding("CONFIRMED", "a", 1, 210, 120), 250 * S),  # the same episode, counted once
        (finding("SUSPECT", "b", 7, 120), 150 * S),  # another GPU: unexplained
        (finding("SUSPECT", "c", 0, 90), 130 * S),
        (finding("HARD_ERROR", "d", 3, 180), 220 * S),
    ]
    recs = [
        (rec("DRAIN", "c", 800), 810 * S),
        (rec("DRAIN", "d", 210), 220 * S),
        (rec("DRAIN", "e", 300), 310 * S),  # no fault on node e: a false drain
        (rec("ALERT", "b", 150), 150 * S),  # the label is on GPU 2 but alerts are per node
        (rec("ALERT", "f", 150), 150 * S),  # false alert
        (rec("ALERT", "f", 160, reason="job-wide slowdown"), 160 * S),  # job-wide: not counted
    ]
    s = score(labels, findings, recs, window_ms=W)
    assert (s.straggler_labels, s.straggler_hits) == (3, 2)
    assert (s.drain_labels, s.drain_hits) == (2, 2)
    assert s.recall == pytest.approx(4 / 5)
    assert (s.hard_labels, s.hard_in_window) == (1, 1)
    assert sorted(s.finding_latency_ms) == [30 * S, 50 * S]
    assert sorted(s.rec_latency_ms) == [20 * S, 710 * S]
    assert s.episodes == 4 and s.episodes_explained == 3
    assert s.precision == pytest.approx(0.75)
    assert (s.drains, s.false_drains, s.false_alerts) == (3, 1, 1)
    assert s.false_drain_records[0]["node"] == "e"
    assert s.by_kind == {"sm_clock_drop 8%": [1, 1], "sm_clock_drop 5%": [1, 0],
                         "thermal_throttle": [1, 1]}  # fmt: skip
    assert [m["missing"] for m in s.missed] == ["finding"]


def test_a_finding_outside_the_label_time_does_not_recall_it() -> None:
    labels = [label("power_brake", "a", 0, 100, 200, "straggler")]
    s = score(labels, [(finding("SUSPECT", "a", 0, 210), 250 * S)], [], window_ms=W)
    assert s.straggler_hits == 0


def test_hard_error_drained_too_late_misses_the_one_window_target() -> None:
    labels = [label("pcie_downtrain", "a", 0, 100, 900, "drain")]
    s = score(labels, [], [(rec("DRAIN", "a", 180), 190 * S)], window_ms=W)
    assert (s.drain_hits, s.hard_labels, s.hard_in_window) == (1, 1, 0)
    checks = {t.name.split(" ")[0]: t.passed for t in targets(s, 30)}
    assert checks["hard"] is False
    # A fault between two ticks shows in the next sample: one interval more is allowed.
    labels = [label("gpu_lost", "a", 0, 179, 900, "drain")]
    drain = [(rec("DRAIN", "a", 210), 220 * S)]
    assert score(labels, [], drain, window_ms=W).hard_in_window == 0
    assert score(labels, [], drain, window_ms=W, interval_ms=2 * S).hard_in_window == 1


def test_scores_add_up_and_targets_check_the_sum() -> None:
    a = Score(straggler_labels=50, straggler_hits=50, finding_latency_ms=[40 * S] * 3,
              by_kind={"sm_clock_drop 6%": [50, 50]}, hard_labels=2, hard_in_window=2)  # fmt: skip
    b = Score(straggler_labels=50, straggler_hits=48, finding_latency_ms=[70 * S] * 2,
              by_kind={"sm_clock_drop 6%": [50, 48]}, drains=3, false_drains=1)  # fmt: skip
    a.add(b)
    assert a.by_kind == {"sm_clock_drop 6%": [100, 98]}
    assert a.recall == pytest.approx(0.98)
    a.add(Score(episodes=100, episodes_explained=98, confirm_latency_ms=[50 * S]))
    passed = {t.name.split(" (")[0]: t.passed for t in targets(a, 30)}
    assert passed == {
        "recall, clock drops >= 5% / throttling, jobs >= 8 GPUs": False,  # 0.98
        "hard errors recommended within one window": True,
        "false drains": False,  # one
        "precision of finding episodes": True,  # 0.98
        "median onset->finding": False,  # 40 s
        "p95 onset->finding": False,  # 70 s
        "median onset->CONFIRMED": True,  # 50 s
    }


def test_detected_ms_by_kind_and_confirmed_latency() -> None:
    labels = [
        label("sm_clock_drop", "a", 1, 100, 400, "straggler", pct=8),
        label("thermal_throttle", "c", 0, 100, 1000, "drain"),
        label("xid", "d", 3, 200, 1200, "drain", xid=48),
    ]
    suspect = finding("SUSPECT", "a", 1, 105) | {"detected_ms": 115 * S}
    confirmed = finding("CONFIRMED", "a", 1, 140, 105) | {"detected_ms": 150 * S}
    hard = finding("HARD_ERROR", "d", 3, 195) | {"detected_ms": 201 * S}
    no_field = finding("SUSPECT", "c", 0, 100)  # an older record: its window end stands in
    found = [(suspect, 120 * S), (confirmed, 155 * S), (hard, 202 * S), (no_field, 135 * S)]
    s = score(labels, found, [], window_ms=W)
    assert s.detect_by_kind == {"sm_clock_drop 8%": [15 * S], "thermal_throttle": [30 * S],
                                "xid 48": [1 * S]}  # fmt: skip
    assert s.confirm_latency_ms == [55 * S]
    summary = s.to_dict()["onset_to_detected_s_by_kind"]["sm_clock_drop 8%"]
    assert summary == {"n": 1, "median": 15.0, "p95": 15.0, "max": 15.0}


def test_percentiles_and_summaries() -> None:
    assert percentile([], 95) is None
    assert percentile([5, 1, 3], 50) == 3
    assert percentile(list(range(1, 101)), 95) == 95
    assert latency_summary([10_000, 20_000, 60_000]) == {"n": 3, "median": 20.0, "p95": 60.0}
    assert (
        kind_of(label("sm_clock_drop", "a", 0, 0, 1, "straggler", pct=5.5)) == "sm_clock_drop 5.5%"
    )


def test_overrides() -> None:
    s = parse_overrides(["detector.mad_floor_clk_rel=0.009", "pipeline.lateness_s=7",
                         "policy.drain_after_confirmed_s=300"])  # fmt: skip
    assert s.detector.mad_floor_clk_rel == 0.009
    assert s.stream.lateness_s == 7 and s.policy.drain_after_confirmed_s == 300
    for bad in (
        "mad_floor_clk_rel=1",
        "detector.no_such=1",
        "pipeline.nope=1",
        "detector.z_threshold=-1",
    ):
        with pytest.raises(ConfigError):
            parse_overrides([bad])


def test_suites_cover_every_fault_and_confounder_and_job_sizes() -> None:
    from peerwatch.producers.sim import CONFOUNDER_KINDS, FAULT_KINDS

    scenarios = suite("quick")
    names = {s.name for s in scenarios}
    assert len(names) == len(scenarios)
    faults = {f["name"] for s in scenarios for f in s.doc.get("faults", [])}
    conf = {c["name"] for s in scenarios for c in s.doc.get("confounders", [])}
    # the NIC kinds have a suite of their own (quick and full stay as they were)
    from peerwatch.producers.sim.nic import NIC_CONFOUNDERS, NIC_FAULTS

    assert faults == set(FAULT_KINDS) - NIC_FAULTS
    assert conf == set(CONFOUNDER_KINDS) - NIC_CONFOUNDERS
    network = suite("network")
    assert {f["name"] for s in network for f in s.doc["faults"]} == NIC_FAULTS
    assert {c["name"] for s in network for c in s.doc["confounders"]} == NIC_CONFOUNDERS
    sizes = {j["gpus"] for s in scenarios for j in s.doc.get("jobs", [])}
    assert min(sizes) <= 2 and max(sizes) == 512
    assert len(suite("full")) > len(scenarios)
    with pytest.raises(ValueError):
        suite("huge")


def test_network_labels_are_recalled_per_kind_by_a_network_finding_naming_node_and_port() -> None:
    retrans = {**label("nic_retransmit", "a", None, 100, 400, "network"), "port": "mlx5_3/1"}
    half = {**label("nic_half_rate", "b", None, 100, 400, "network"), "port": "mlx5_6/1"}
    leaf = {**label("switch_congestion", "c", None, 100, 400, "switch"), "nodes": ["c", "d"]}
    net = {**finding("CONFIRMED", "a", None, 120), "cause": "NETWORK", "port": "mlx5_3/1",
           "detected_ms": 150 * S}  # fmt: skip
    wrong_port = {**finding("SUSPECT", "b", None, 120), "cause": "NETWORK", "port": "mlx5_0/1"}
    gpu = finding("SUSPECT", "b", None, 120)  # no cause NETWORK: a GPU finding
    s = score([retrans, half, leaf], [(net, 150 * S), (wrong_port, 150 * S), (gpu, 150 * S)], [],
              W)  # fmt: skip
    assert s.network_by_kind == {"nic_retransmit": [1, 1], "nic_half_rate": [1, 0],
                                 "switch_congestion": [1, 0]}  # fmt: skip
    assert s.by_kind == {}  # the GPU clock-drop recall target does not count them
    assert s.detect_by_kind == {"nic_retransmit": [50 * S]}
    assert [m["name"] for m in s.missed] == ["nic_half_rate", "switch_congestion"]
    # neither straggler nor drain labels: the GPU recall is untouched
    assert (s.straggler_labels, s.drain_labels, s.recall) == (0, 0, None)
    (named,) = [t for t in targets(s, 5) if t.name.startswith("NIC faults named")]
    assert (named.value, named.passed) == (1 / 3, False)
    # every NIC fault kind's recall and the first finding's latency (issue 38 "Done when")
    assert s.nic_by_kind == {"nic_retransmit": [1, 1], "nic_half_rate": [1, 0],
                             "switch_congestion": [1, 0]}  # fmt: skip
    assert s.nic_latency_ms == [50 * S]
    checks = {t.name: t for t in targets(s, 5)}
    worst = checks["NIC faults: recall of the worst fault kind (drain or NETWORK finding)"]
    assert (worst.value, worst.passed) == (0.0, False)
    first = checks["NIC faults: median onset->first finding (s)"]
    assert (first.value, first.passed) == (50.0, False)


def test_nic_drain_labels_count_in_their_kind_s_recall_and_a_label_expecting_nothing_not() -> None:
    flap = {**label("nic_port_flap", "a", None, 100, 400, "drain"), "port": "mlx5_1/1"}
    small = {**label("nic_symbol_errors", "b", None, 100, 400, "nothing"), "port": "mlx5_0/1"}
    hard = {**finding("HARD_ERROR", "a", None, 100), "cause": "NETWORK", "port": "mlx5_1/1",
            "detected_ms": 101 * S}  # fmt: skip
    drain = {"action": "DRAIN", "node": "a", "ts_ms": 101 * S, "reason": "hard error"}
    s = score([flap, small], [(hard, 101 * S)], [(drain, 101 * S)], W)
    assert s.nic_by_kind == {"nic_port_flap": [1, 1]}
    assert s.nic_latency_ms == [1 * S]
    assert "nic_recall_by_kind" in s.to_dict()
    assert "nic_recall_by_kind" not in score([], [], [], W).to_dict()  # other suites: as before
