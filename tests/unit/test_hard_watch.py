"""Hard rules on arrival (HardWatch) and the silence watch (SilenceWatch): pure, no process."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from peerwatch.schemas.columns import tables_from_records
from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.hard_watch import HardWatch
from peerwatch.streams.core.policy import apply
from peerwatch.streams.core.policy_state import DrainPolicyState
from peerwatch.streams.core.settings import DetectorSettings, PolicySettings
from peerwatch.streams.core.silence import FLEET_JOB, SilenceWatch
from peerwatch.streams.core.windows import SAMPLE_SPEC

WINDOW_MS = 30_000


class Watch:
    """A HardWatch fed with decoded sample dicts (through the same columns as the hot path)."""

    def __init__(self, alloc: AllocationTable | None = None) -> None:
        self.strings: dict[str, int] = {}
        self.names: list[str] = []
        self.hw = HardWatch(alloc or AllocationTable(), self.name, DetectorSettings())

    def name(self, code: int) -> str:
        if len(self.names) < len(self.strings):
            self.names.extend(list(self.strings)[len(self.names) :])
        return self.names[code]

    def feed(self, *samples: dict[str, Any]) -> list[dict[str, Any]]:
        tables = tables_from_records(SAMPLE_SPEC, list(samples), self.strings)
        return [dict(f) for f in self.hw.add_columns(tables)]


def gpu(index: int, **kw: Any) -> dict[str, Any]:
    reading = {"index": index, "uuid": f"GPU-{index}", "state": "OK",
               "ecc_volatile_uncorrected": 0, "nvlink_replay_errors": 0,
               "nvlink_recovery_errors": 0, "nvlink_crc_errors": 0, "pcie_link_width": 16,
               "pcie_link_width_max": 16, "remap_pending": False, "remap_failed": False}  # fmt: skip
    reading.update(kw)
    return reading


def sample(node: str, ts_ms: int, *gpus: dict[str, Any], xids: Any = ()) -> dict[str, Any]:
    return {"node": node, "ts_ms": ts_ms, "gpus": list(gpus), "xids": list(xids)}


def started(job: str, node: str, *gpus: int, at_ms: int = 0) -> dict[str, Any]:
    return {"job_id": job, "kind": "STARTED", "ts_ms": at_ms, "start_ms": at_ms,
            "allocations": [{"node": node, "gpu_indices": list(gpus)}]}  # fmt: skip


def rules(findings: list[dict[str, Any]]) -> list[tuple[str, int, list[str], int]]:
    return [(f["node"], f["gpu_index"], f["hard_rules"], f["detected_ms"]) for f in findings]


def test_a_hard_xid_fires_at_its_sample_with_the_owner_and_the_sample_time() -> None:
    alloc = AllocationTable()
    alloc.apply_event(started("42", "n1", 0, 1))
    w = Watch(alloc)
    assert w.feed(sample("n1", 1000, gpu(0), gpu(1))) == []
    found = w.feed(sample("n1", 61_500, gpu(0), gpu(1), xids=[
        {"gpu_index": 1, "xid": 79, "ts_ms": 61_200}, {"gpu_index": 0, "xid": 13, "ts_ms": 61_200},
    ]))  # fmt: skip
    assert rules(found) == [("n1", 1, ["xid_79"], 61_500)]
    f = found[0]
    assert (f["job_id"], f["status"], f["cause"], f["gpu_uuid"]) == (
        "42",
        "HARD_ERROR",
        "HARDWARE",
        "GPU-1",
    )
    window_ms = DetectorSettings().window_ms  # the window holding the sample
    start_ms = 61_500 // window_ms * window_ms
    assert (f["window_start_ms"], f["window_end_ms"]) == (start_ms, start_ms + window_ms)


def test_counter_rises_need_a_baseline_and_a_storm_is_one_finding() -> None:
    w = Watch()
    # present at the first reading: a counter value is no rise (no baseline)
    assert w.feed(sample("n", 1000, gpu(0, ecc_volatile_uncorrected=3))) == []
    assert rules(w.feed(sample("n", 2000, gpu(0, ecc_volatile_uncorrected=4)))) == [
        ("n", 0, ["ecc_uncorrected"], 2000)
    ]
    # NVLink errors rising every second for a minute: one finding (rule memory)
    storm = [sample("n", 3000 + 1000 * i, gpu(0, ecc_volatile_uncorrected=4,
                                              nvlink_crc_errors=10 * i)) for i in range(60)]  # fmt: skip
    assert rules(w.feed(*storm)) == [("n", 0, ["nvlink_errors"], 4000)]
    assert w.hw.findings == 2


def test_conditions_fire_when_they_appear_or_at_the_first_reading_on_idle_gpus_too() -> None:
    w = Watch()
    first = w.feed(
        sample("idle1", 1000, gpu(0, pcie_link_width=8), gpu(1, state="LOST"), gpu(2)),
    )
    assert rules(first) == [
        ("idle1", 0, ["pcie_width_degraded"], 1000),
        ("idle1", 1, ["gpu_lost"], 1000),
    ]
    assert {f["job_id"] for f in first} == {"idle:idle1"}
    # lasting: nothing more; a new condition on another GPU fires, in the same batch order
    later = w.feed(
        sample("idle1", 2000, gpu(0, pcie_link_width=8), gpu(1, state="LOST"), gpu(2)),
        sample("idle1", 3000, gpu(0, pcie_link_width=8), gpu(1, state="LOST"),
               gpu(2, remap_pending=True, remap_failed=True)),
    )  # fmt: skip
    assert rules(later) == [("idle1", 2, ["remap_failed", "remap_pending"], 3000)]


def test_a_lost_gpu_keeps_its_counters_and_a_late_sample_fires_nothing() -> None:
    w = Watch()
    w.feed(sample("n", 1000, gpu(0, ecc_volatile_uncorrected=1, remap_pending=True)))
    assert rules(w.feed(sample("n", 2000, gpu(0, state="LOST")))) == [("n", 0, ["gpu_lost"], 2000)]
    # back with the same counter and flag: neither is new
    assert w.feed(sample("n", 3000, gpu(0, ecc_volatile_uncorrected=1, remap_pending=True))) == []
    # an old sample arriving late, with a lower counter, then the current value: no "rise"
    assert w.feed(sample("n", 1500, gpu(0, ecc_volatile_uncorrected=0))) == []
    assert w.feed(sample("n", 4000, gpu(0, ecc_volatile_uncorrected=1, remap_pending=True))) == []


def test_hostile_values_are_counted_not_crashing() -> None:
    w = Watch()
    found = w.feed(
        sample("n", -5, gpu(0, state="LOST")),
        sample("n", 1 << 60, gpu(0, state="LOST")),
        sample("n", 1000, gpu(0, ecc_volatile_uncorrected=-3, nvlink_crc_errors=1 << 62)),
        sample("n", 2000, gpu(0, ecc_volatile_uncorrected=1 << 62)),
        sample("n", 3000, gpu(-7, pcie_link_width=-1), gpu(2**31 - 1, pcie_link_width=4)),
    )
    assert rules(found) == [("n", 2**31 - 1, ["pcie_width_degraded"], 3000)]
    assert w.hw.invalid_samples == 2 and w.hw.bad_values == 4


def test_prune_forgets_quiet_gpus_and_keeps_the_others() -> None:
    w = Watch()
    w.feed(sample("a", 1000, gpu(0)), sample("b", 5000, gpu(0, ecc_volatile_uncorrected=1)))
    assert w.hw.prune(2000) == 1 and len(w.hw) == 1
    # b's baseline survived the compaction: a rise still fires, a' first reading does not
    found = w.feed(sample("b", 6000, gpu(0, ecc_volatile_uncorrected=2)),
                   sample("a", 6000, gpu(0, ecc_volatile_uncorrected=9)))  # fmt: skip
    assert rules(found) == [("b", 0, ["ecc_uncorrected"], 6000)]


def test_the_arrival_finding_and_the_later_window_rule_are_one_drain() -> None:
    w = Watch()
    state = DrainPolicyState()
    w.feed(sample("n", 1000, gpu(0)))
    arrival = w.feed(sample("n", 31_000, gpu(0, state="LOST")))[0]
    recs = apply(arrival, state)
    assert [(r["action"], r["hard"], r["ts_ms"]) for r in recs] == [("DRAIN", True, 31_000)]
    # the job's window finding of the same window, and an idle one later: no second drain
    window = {**arrival, "finding_id": "w", "detected_ms": 60_000, "reason": "hard: gpu_lost"}
    idle = {**arrival, "finding_id": "i", "job_id": "idle:n", "detected_ms": 95_000,
            "window_start_ms": 90_000, "window_end_ms": 120_000}  # fmt: skip
    assert apply(window, state) == [] and apply(idle, state) == []


# -- silence ----------------------------------------------------------------------------------
def watched(**jobs: list[str]) -> dict[str, tuple[str, int]]:
    return {n: (job, 0) for job, nodes in jobs.items() for n in nodes}


def test_a_silent_node_is_one_finding_and_clears_when_samples_return() -> None:
    sw = SilenceWatch(silent_after_ms=30_000, group_ms=10_000)
    nodes = watched(j1=["a", "b", "c"])
    for t in range(0, 20_001, 1000):
        for n in "abc":
            sw.saw(n, t)
        assert sw.check(nodes, t) == []
    for t in range(21_000, 60_000, 1000):  # b stops after 20 s
        sw.saw("a", t)
        sw.saw("c", t)
        found = sw.check(nodes, t)
        if t < 50_000:
            assert found == []
        elif t == 50_000:
            assert [(f["status"], f["node"], f["job_id"], f["cause"]) for f in found] == [
                ("SILENT", "b", "j1", "NO_SAMPLES")
            ]
            assert found[0]["detected_ms"] == 50_000 and found[0]["first_flagged_ms"] == 20_000
        else:
            assert found == []
    sw.saw("b", 60_000)
    cleared = sw.check(nodes, 60_000)
    assert [(f["status"], f["node"]) for f in cleared] == [("CLEARED", "b")]
    assert sw.check(nodes, 61_000) == []


def test_a_node_that_never_reported_since_its_job_started_is_silent() -> None:
    sw = SilenceWatch()
    nodes = {"a": ("j", 100_000), "b": ("j2", 100_000)}
    sw.saw("a", 90_000)  # before the job: does not count
    for t in range(100_000, 131_000, 1000):
        sw.saw("b", t)
        found = sw.check(nodes, t)
    assert [(f["status"], f["node"]) for f in found] == [("SILENT", "a")]


def test_a_rack_going_quiet_is_one_fleet_wide_finding_a_job_one_job_finding() -> None:
    sw = SilenceWatch(silent_after_ms=30_000, group_ms=10_000, fleet_min_nodes=8)
    nodes = watched(j1=[f"r{i}" for i in range(6)] + ["x0"], j2=[f"r{i}" for i in range(6, 10)],
                    j3=["y0", "y1"], j4=["z"])  # fmt: skip
    nodes["z"] = ("j4", 45_000)  # z's job starts at 45 s and z never reports
    quiet = {f"r{i}" for i in range(10)}
    seen: list[tuple[int, str, str, str | None, int]] = []
    for t in range(0, 80_001, 1000):
        for n in nodes:
            # the rack stops at 10 s (one node 2 s later); j3 stops at 40 s; z never reports
            stop = {"r9": 12_000, "y0": 40_000, "y1": 40_000, "z": 0}.get(n, 10_000)
            if (n not in quiet and n not in ("y0", "y1", "z")) or t < stop:
                sw.saw(n, t)
        for f in sw.check(nodes, t):
            seen.append((t, f["status"], f["job_id"], f["node"], f["peer_group_size"]))
    # the rack: one finding (the straggling r9 within group_ms joins it); j3 and z, near
    # enough to it, cross together but belong to different jobs: one finding per job
    assert seen == [
        (39_000, "FLEET_WIDE", FLEET_JOB, None, 10),
        (69_000, "SILENT", "j3", None, 2),
        (69_000, "SILENT", "j4", "z", 1),
    ]


def test_policy_alerts_on_silence_and_drains_only_when_configured() -> None:
    finding = {"finding_id": "f", "job_id": "j", "node": "a", "gpu_index": None,
               "status": "SILENT", "window_start_ms": 0, "window_end_ms": 50_000,
               "first_flagged_ms": 20_000, "detected_ms": 50_000, "reason": "no samples",
               "cause": "NO_SAMPLES", "features": [], "hard_rules": []}  # fmt: skip
    recs = apply(finding, DrainPolicyState())
    assert [(r["action"], r["severity"], r["hard"], r["ts_ms"], r["cause"]) for r in recs] == [
        ("ALERT", "WARNING", False, 50_000, "NO_SAMPLES")
    ]
    state = DrainPolicyState()
    drain = apply(finding, state, PolicySettings(drain_on_silent=True))
    assert [(r["action"], r["hard"]) for r in drain] == [("DRAIN", False)]
    assert apply(finding, state, PolicySettings(drain_on_silent=True)) == []  # one per episode
    cleared = {**finding, "finding_id": "c", "status": "CLEARED"}
    assert apply(cleared, state) == []
    group = {**finding, "node": None}
    assert apply(group, DrainPolicyState()) == []


@pytest.mark.parametrize("bad", [{"silent_after_ms": 0}, {"group_ms": 30_000},
                                 {"fleet_min_nodes": 1}])  # fmt: skip
def test_silence_watch_refuses_bad_settings(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        SilenceWatch(**bad)


def test_a_column_batch_gives_each_node_its_latest_valid_time() -> None:
    """``saw_columns``: in time order (a node's last sample is its latest) and out of order
    alike; times outside 0..VALUE_LIMIT are no samples; the result is the lowest and highest
    of the nodes' latest times."""
    names = ["n0", "n1", "n2"]
    in_order = (np.array([0, 1, 0, 2, 1]), np.array([1_000, 1_000, 2_000, 2_000, 3_000]))
    shuffled = (np.array([1, 0, 2, 1, 0]), np.array([3_000, 2_000, 2_000, 1_000, 1_000]))
    for nodes, ts in (in_order, shuffled):
        sw = SilenceWatch()
        sw.last_ms["n2"] = 5_000  # a later sample already seen is kept
        assert sw.saw_columns(nodes, ts, names) == (2_000, 3_000)
        assert sw.last_ms == {"n0": 2_000, "n1": 3_000, "n2": 5_000}
    sw = SilenceWatch()
    none = np.empty(0, np.int64)
    assert sw.saw_columns(none, none, names) is None  # an empty batch (fuzzing found it)
    bad = np.array([-1, 1 << 60])
    assert sw.saw_columns(np.array([0, 1]), bad, names) is None and sw.last_ms == {}
    assert sw.saw_columns(np.array([0, 1, 0]), np.array([-5, 7_000, 1 << 60]), names) == (
        7_000,
        7_000,
    )
    assert sw.last_ms == {"n1": 7_000}


def test_batches_of_two_string_tables_are_noted_by_node_name_at_their_latest() -> None:
    """Two aggregators (live: two partitions) code the same node differently; their batches,
    noted by name when a check needs them, give each node its latest time across both, and a
    later batch of a table grown meanwhile is noted too."""
    a, b = ["n0", "n1"], ["n1", "n0"]
    sw = SilenceWatch(silent_after_ms=30_000, group_ms=0)
    sw.saw_columns(np.array([0, 1]), np.array([4_000, 1_000]), a)
    sw.saw_columns(np.array([0, 1]), np.array([2_000, 3_000]), b)  # n1 at 2 s, n0 at 3 s
    sw.saw("n1", 1_500)
    a.append("n2")
    assert sw.saw_columns(np.array([2, 0]), np.array([6_000, 3_500]), a) == (3_500, 6_000)
    assert sw.last_ms == {"n0": 4_000, "n1": 2_000, "n2": 6_000}
    # watched from 1 s: the node silent since 2 s is found at 35 s, the one seen at 6 s not yet
    watched = {"n1": ("9", 0), "n2": ("8", 0)}
    assert sw.check(watched, 1_000) == []
    found = sw.check(watched, 35_000)
    assert [(f["status"], f["node"]) for f in found] == [("SILENT", "n1")]


def test_per_node_clocks_and_the_start_of_reading_decide_silence() -> None:
    sw = SilenceWatch(silent_after_ms=30_000, group_ms=0)
    nodes = watched(j=["a", "b", "c"])
    for n in "abc":
        sw.saw(n, 10_000)
    clocks = {"a": 50_000, "b": 20_000, "c": None}  # b's partition is still being read
    # a: quiet since 10 s by its clock; b: not yet; c: its clock unknown, not looked at
    found = sw.check(nodes, 50_000, clocks.get, watch_from=lambda n: 0)
    assert [(f["status"], f["node"], f["detected_ms"]) for f in found] == [("SILENT", "a", 40_000)]
    # a node first watched now is watched from when its partition was first read
    late = SilenceWatch(silent_after_ms=30_000, group_ms=0)
    assert late.check({"d": ("j", 0)}, 100_000, watch_from=lambda n: 60_000)[0]["node"] == "d"
    fresh = SilenceWatch(silent_after_ms=30_000, group_ms=0)
    assert fresh.check({"d": ("j", 0)}, 100_000) == []  # without it: from now


def test_replay_paths_agree_on_arrival_and_silence_findings(tmp_path: Any) -> None:
    """The archive replay and the simulator's records replayed from memory give the same hard-on-arrival and silence findings and recommendations, in order."""
    from peerwatch.producers.sim.fleet import Fleet
    from peerwatch.producers.sim.publish import write_archive
    from peerwatch.producers.sim.scenario import parse_scenario
    from peerwatch.streams.offline.replay import (
        TimeRange,
        archive_records,
        live_equivalent_settings,
        replay,
        sort_records,
    )

    doc = {
        "fleet": {"nodes": 6, "gpus_per_node": 8, "interval_s": 2.0, "duration_s": 300,
                  "seed": 9},
        "jobs": [{"job_id": "61", "gpus": 32, "first_node": 0, "warmup_s": 0}],
        "faults": [
            {"name": "xid", "node": 1, "gpu_index": 2, "start_s": 101, "params": {"xid": 94}},
            {"name": "gpu_lost", "node": 5, "gpu_index": 0, "start_s": 0},  # idle, at start
            {"name": "agent_silent", "node": 3, "start_s": 150, "end_s": 230},
        ],
    }  # fmt: skip
    fleet = Fleet(parse_scenario(doc))
    write_archive(fleet, tmp_path)
    settings = live_equivalent_settings()
    span = TimeRange(fleet.spec.start_ms, fleet.spec.start_ms + 3_600_000)
    columns = replay(archive_records(tmp_path, span), settings)
    mem = replay(sort_records((r.stream, r.value) for t in fleet.ticks() for r in t), settings)
    assert mem.findings == columns.findings
    assert mem.recommendations == columns.recommendations
    kinds = [(f["status"], f["node"], f["cause"]) for f in columns.findings
             if f["cause"] in ("HARDWARE", "NO_SAMPLES")]  # fmt: skip
    assert kinds[0] == ("HARD_ERROR", "gpu00005", "HARDWARE")  # the first sample shows it
    assert ("HARD_ERROR", "gpu00001", "HARDWARE") in kinds
    assert kinds[-2:] == [
        ("SILENT", "gpu00003", "NO_SAMPLES"),
        ("CLEARED", "gpu00003", "NO_SAMPLES"),
    ]
    assert {(r["node"], r["action"]) for r in columns.recommendations} == {
        ("gpu00005", "DRAIN"),
        ("gpu00001", "DRAIN"),
        ("gpu00003", "ALERT"),
    }
