"""The simulated fleet: records validate against the Avro contracts, output is deterministic,
sequence numbers, clock skew, missing samples, scheduling, step times and labels."""

from __future__ import annotations

import collections
import io
import itertools
import json
import pathlib
from typing import Any

import fastavro
import pytest
from fastavro.validation import validate

from peerwatch.producers.sim import Fleet, SimRecord, default_scenario, load_scenario
from peerwatch.producers.sim.nic import NIC_CONFOUNDERS, NIC_FAULTS
from peerwatch.producers.sim.scenario import CONFOUNDER_KINDS, FAULT_KINDS, parse_scenario

ROOT = pathlib.Path(__file__).parents[2]
SCENARIOS = ROOT / "producers" / "sim" / "scenarios"
SCHEMA_FOR = {
    "samples": "NodeGpuSample",
    "job-events": "JobEvent",
    "node-events": "NodeStateEvent",
    "step-times": "StepTime",
}
START_MS = 1_767_225_600_000

NIC_KINDS = NIC_FAULTS | NIC_CONFOUNDERS


def _schema(name: str) -> Any:
    return fastavro.parse_schema(json.loads((ROOT / "schemas" / f"{name}.avsc").read_text()))


SCHEMAS = {stream: _schema(name) for stream, name in SCHEMA_FOR.items()}
SCHEMAS["nic-samples"] = _schema("NodeNicSample")  # fleets with NICs (the demo's)

#: Every fault and confounder on a 16-node fleet with a random workload, step times on.
EVERYTHING: dict[str, Any] = {
    "fleet": {"nodes": 16, "gpus_per_node": 8, "interval_s": 10, "duration_s": 900, "seed": 5,
              "step_times": True},
    "workload": {"count": 6, "initial_fill": 0.3, "requeue_prob": 0.5, "duration_s": [120, 600]},
    "jobs": [
        {"job_id": "a", "gpus": 32, "first_node": 0, "warmup_s": 0, "checkpoint_every_s": 300,
         "checkpoint_s": 30, "eval_every_s": 400, "eval_s": 40},
        {"job_id": "b", "gpus": 16, "nodes": ["gpu00004", "gpu00005"], "warmup_s": 0,
         "requeue_on_failure": True, "requeue_delay_s": 20},
        {"job_id": "c", "gpus": 3, "start_s": 30, "duration_s": 300},
    ],
    "faults": [
        {"name": "sm_clock_drop", "node": 0, "gpu_index": 1, "start_s": 60, "end_s": 800,
         "params": {"pct": 8}},
        {"name": "sm_clock_drop", "node": 0, "gpu_index": 2, "start_s": 60, "end_s": 300,
         "params": {"pct": 3}},
        {"name": "thermal_throttle", "node": 1, "gpu_index": 2, "start_s": 100, "end_s": 300},
        {"name": "power_brake", "node": 2, "gpu_index": 3, "start_s": 100, "end_s": 200},
        {"name": "xid", "node": 4, "gpu_index": 0, "start_s": 200, "params": {"xid": 79}},
        {"name": "xid", "node": 3, "gpu_index": 0, "start_s": 150, "params": {"xid": 43}},
        {"name": "nvlink_error_storm", "node": 3, "gpu_index": 4, "start_s": 100},
        {"name": "pcie_downtrain", "node": 3, "gpu_index": 5, "start_s": 100},
        {"name": "gpu_lost", "node": 12, "gpu_index": 6, "start_s": 500},
        {"name": "agent_silent", "node": 1, "start_s": 400, "end_s": 500},
    ],
    "confounders": [
        {"name": "checkpoint", "node": 0, "start_s": 400, "end_s": 450},
        {"name": "eval_pause", "node": 0, "start_s": 500, "end_s": 550},
        {"name": "pipeline_stages", "node": 0, "start_s": 600},
        {"name": "dataloader_stall", "node": 1, "gpu_index": 0, "start_s": 300, "end_s": 400},
        {"name": "network_slowdown", "node": 2, "start_s": 650, "end_s": 700},
        {"name": "cluster_power_cap", "start_s": 700, "end_s": 800},
        {"name": "cluster_cooling", "start_s": 820, "end_s": 860},
        {"name": "small_jobs", "start_s": 0, "end_s": 200, "params": {"count": 5}},
        {"name": "requeue", "node": 4, "start_s": 100, "end_s": 110},
        {"name": "missing_samples", "node": 5, "start_s": 100, "end_s": 600},
        {"name": "clock_skew", "node": 6, "start_s": 0, "params": {"offset_ms": -1700}},
    ],
}  # fmt: skip


def records(doc: dict[str, Any]) -> list[list[SimRecord]]:
    return list(Fleet(parse_scenario(doc)).ticks())


@pytest.fixture(scope="module")
def everything() -> list[list[SimRecord]]:
    return records(EVERYTHING)


def by_stream(ticks: list[list[SimRecord]], stream: str) -> list[SimRecord]:
    return [r for recs in ticks for r in recs if r.stream == stream]


def test_every_record_validates_against_its_schema(everything: list[list[SimRecord]]) -> None:
    counts = collections.Counter(r.stream for recs in everything for r in recs)
    assert set(counts) == set(SCHEMA_FOR)
    injected = {f"gpu{n:05d}" for n in (0, 1, 2, 3, 4, 5, 6, 12)}
    for i, recs in enumerate(everything):
        for rec in recs:
            assert isinstance(rec.key, str) and rec.key
            schema = SCHEMAS[rec.stream]
            # fastavro.validation is pure Python (~3 ms per 8-GPU sample): it checks every record
            # except samples of untouched nodes on most ticks; the C encoder checks those too.
            if rec.stream != "samples" or rec.key in injected or i % 5 == 0:
                assert validate(rec.value, schema, raise_errors=True)
            fastavro.schemaless_writer(io.BytesIO(), schema, rec.value, strict=True)


@pytest.mark.parametrize(
    ("name", "ticks"), [("demo.json", 310), ("confounders.json", 420), ("all-faults.toml", 600)]
)
def test_shipped_scenarios_validate(name: str, ticks: int) -> None:
    sc = load_scenario(SCENARIOS / name)
    fleet = Fleet(sc)
    # The first minutes (the other tests cover every kind); every record of a sample of ticks keeps this test quick.
    for i, recs in enumerate(itertools.islice(fleet.ticks(), ticks)):
        if i % 97 and i < ticks - 3:
            continue
        for rec in recs:
            assert validate(rec.value, SCHEMAS[rec.stream], raise_errors=True)
    assert len(fleet.labels()) == len(sc.injections)


def test_same_seed_same_records_different_seed_different() -> None:
    again = records(EVERYTHING)
    assert again == records(EVERYTHING)
    other = json.loads(json.dumps(EVERYTHING))
    other["fleet"]["seed"] = 6
    changed = records(other)
    assert changed != again
    first = by_stream(again, "samples")[0].value["gpus"][0]
    assert by_stream(changed, "samples")[0].value["gpus"][0] != first


def test_ticks_can_be_iterated_twice() -> None:
    fleet = Fleet(default_scenario(nodes=8, duration_s=30, seed=2))
    assert list(fleet.ticks()) == list(fleet.ticks())


def test_seq_is_strictly_plus_one_per_node(everything: list[list[SimRecord]]) -> None:
    seqs: dict[str, list[int]] = collections.defaultdict(list)
    for rec in by_stream(everything, "samples"):
        seqs[rec.key].append(rec.value["seq"])
        assert rec.value["interval_ms"] == 10_000
    assert len(seqs) == 16
    for node, values in seqs.items():
        assert values == list(range(len(values))), node
    # missing_samples (mode not_sampled) drops ticks of gpu00005 without a seq gap
    assert len(seqs["gpu00005"]) < len(seqs["gpu00000"]) == 90


def test_lost_samples_leave_seq_gaps() -> None:
    doc = {
        "fleet": {"nodes": 2, "interval_s": 5, "duration_s": 300, "seed": 1},
        "confounders": [{"name": "missing_samples", "node": 1, "start_s": 0,
                         "params": {"drop_prob": 0.5, "mode": "lost"}}],
    }  # fmt: skip
    seq = [r.value["seq"] for r in by_stream(records(doc), "samples") if r.key == "gpu00001"]
    assert 10 < len(seq) < 50 and seq == sorted(set(seq)) and seq[-1] >= len(seq)


def test_clock_skew_shifts_only_that_node(everything: list[list[SimRecord]]) -> None:
    for recs in everything:
        times = {r.key: r.value["ts_ms"] for r in recs if r.stream == "samples"}
        if "gpu00006" in times:
            assert times["gpu00006"] == times["gpu00000"] - 1700
            assert len({t for n, t in times.items() if n != "gpu00006"}) == 1


def test_agent_run_id_is_per_node_and_seeded(everything: list[list[SimRecord]]) -> None:
    ids = {r.key: r.value["agent_run_id"] for r in by_stream(everything, "samples")}
    assert len(set(ids.values())) == 16
    other = Fleet(default_scenario(nodes=16, seed=6)).agent_run_ids
    assert set(other).isdisjoint(ids.values())


def test_events_come_before_samples_in_each_tick(everything: list[list[SimRecord]]) -> None:
    order = {"job-events": 0, "node-events": 0, "samples": 1, "step-times": 2}
    for recs in everything:
        ranks = [order[r.stream] for r in recs]
        assert ranks == sorted(ranks)
        sample_ts = [
            r.value["ts_ms"] for r in recs if r.stream == "samples" and r.key != "gpu00006"
        ]
        for r in recs:
            if r.stream in ("job-events", "node-events") and sample_ts:
                assert r.value["ts_ms"] <= sample_ts[0]


def test_job_events_allocations_and_lifecycle(everything: list[list[SimRecord]]) -> None:
    events = [r.value for r in by_stream(everything, "job-events")]
    assert len({e["event_id"] for e in events}) == len(events)
    assert all(e["source"] == "SIMULATOR" and e["user"] and e["partition"] for e in events)
    a = next(e for e in events if e["job_id"] == "a" and e["kind"] == "STARTED")
    assert [x["node"] for x in a["allocations"]] == [f"gpu{n:05d}" for n in range(4)]
    assert all(x["gpu_indices"] == list(range(8)) for x in a["allocations"])
    c = next(e for e in events if e["job_id"] == "c" and e["kind"] == "STARTED")
    assert len(c["allocations"]) == 1 and len(c["allocations"][0]["gpu_indices"]) == 3
    # the requeue confounder hits job b on gpu00004: REQUEUED, then STARTED again
    b = [(e["kind"], e["restart_count"]) for e in events if e["job_id"] == "b"]
    assert b[:3] == [("STARTED", 0), ("REQUEUED", 0), ("STARTED", 1)]
    # XID 79 kills it 30 s later; requeue_on_failure puts it back in the queue
    assert ("REQUEUED", 1) in b
    for e in events:
        if e["kind"] == "ENDED":
            assert e["end_ms"] is not None and e["state"] in ("COMPLETED", "FAILED")
    small = [e for e in events if e["kind"] == "STARTED" and e["job_id"] not in "abc"]
    for e in small:
        gpus = sum(len(x["gpu_indices"]) for x in e["allocations"])
        if gpus < 8:
            assert len(e["allocations"]) == 1  # small jobs are packed on one node
        else:
            assert all(len(x["gpu_indices"]) == 8 for x in e["allocations"][:-1])


def test_no_gpu_is_given_to_two_jobs(everything: list[list[SimRecord]]) -> None:
    owner: dict[tuple[str, int], str] = {}
    for e in (r.value for r in by_stream(everything, "job-events")):
        for a in e["allocations"]:
            for g in a["gpu_indices"]:
                key = (a["node"], g)
                if e["kind"] == "STARTED":
                    assert key not in owner, (key, owner.get(key), e["job_id"])
                    owner[key] = e["job_id"]
                elif owner.get(key) == e["job_id"]:
                    del owner[key]


def test_node_events_report_initial_state_and_changes(everything: list[list[SimRecord]]) -> None:
    events = [r.value for r in by_stream(everything, "node-events")]
    first = [e for e in events if e["ts_ms"] == START_MS]
    assert len(first) == 16
    states = {e["node"]: e["state"] for e in first}
    assert states["gpu00000"] == "ALLOCATED"
    assert all(e["source"] == "SIMULATOR" and e["state"] in ("IDLE", "MIXED", "ALLOCATED")
               for e in events)  # fmt: skip


def test_step_times_are_slower_on_the_straggler(everything: list[list[SimRecord]]) -> None:
    steps = [r.value for r in by_stream(everything, "step-times") if r.value["job_id"] == "a"]
    window = [s for s in steps if START_MS + 100_000 <= s["ts_ms"] < START_MS + 250_000]
    slow = [s["step_duration_ms"] for s in window if (s["node"], s["gpu_index"]) == ("gpu00000", 1)]
    rest = [s["step_duration_ms"] for s in window
            if s["node"] == "gpu00000" and s["gpu_index"] not in (1, 2)]  # fmt: skip
    assert slow and rest
    assert min(slow) > max(rest)
    assert sorted({s["rank"] for s in steps}) == list(range(32))
    by_rank = collections.defaultdict(list)
    for s in steps:
        by_rank[s["rank"]].append(s["step"])
    assert all(v == sorted(v) for v in by_rank.values())


def test_labels_cover_every_injection() -> None:
    fleet = Fleet(parse_scenario(EVERYTHING))
    labels = fleet.labels()
    assert len(labels) == len(EVERYTHING["faults"]) + len(EVERYTHING["confounders"])
    # NIC kinds need fleet.nics_per_node: test_sim_nic labels them
    assert {lb["name"] for lb in labels} == (FAULT_KINDS | CONFOUNDER_KINDS) - NIC_KINDS
    json.dumps(labels)  # JSON-lines ready
    expect = [(lb["name"], lb["gpu_index"], lb["job_id"], lb["expect"]) for lb in labels]
    assert expect[:10] == [
        ("sm_clock_drop", 1, "a", "drain"),  # 12 min in a 32-GPU job
        ("sm_clock_drop", 2, "a", "nothing"),  # 3% is below the material threshold
        ("thermal_throttle", 2, "a", "straggler"),
        ("power_brake", 3, "a", "straggler"),
        ("xid", 0, "b", "drain"),
        ("xid", 0, "a", "nothing"),  # XID 43 is an application fault
        ("nvlink_error_storm", 4, "a", "drain"),
        ("pcie_downtrain", 5, "a", "drain"),
        ("gpu_lost", 6, labels[8]["job_id"], "drain"),
        ("agent_silent", None, "a", "silent"),  # a job owns the node
    ]
    confounders = labels[10:]
    assert all(lb["kind"] == "confounder" and lb["expect"] == "nothing" for lb in confounders)
    assert [lb["job_id"] for lb in confounders[:3]] == ["a", "a", "a"]
    requeue = next(lb for lb in confounders if lb["name"] == "requeue")
    assert requeue["job_id"] == "b" and requeue["node"] == "gpu00004"
    power_cap = next(lb for lb in confounders if lb["name"] == "cluster_power_cap")
    assert power_cap["node"] is None and power_cap["job_id"] is None
    assert power_cap["start_ms"] == START_MS + 700_000 and power_cap["end_ms"] == START_MS + 800_000


def test_clock_fault_in_a_small_job_or_idle_gpu_expects_nothing() -> None:
    doc = {
        "fleet": {"nodes": 2, "duration_s": 900, "seed": 1},
        "jobs": [{"job_id": "s", "gpus": 4, "duration_s": 3600}],
        "faults": [
            {"name": "thermal_throttle", "node": 0, "gpu_index": 0, "start_s": 10},
            {"name": "thermal_throttle", "node": 1, "gpu_index": 0, "start_s": 10},
        ],
    }
    labels = Fleet(parse_scenario(doc)).labels()
    assert [(lb["job_id"], lb["expect"]) for lb in labels] == [("s", "nothing"), (None, "nothing")]


def test_demo_scenario_labels() -> None:
    labels = Fleet(load_scenario(SCENARIOS / "demo.json")).labels()
    assert [(lb["name"], lb["node"], lb["job_id"], lb["expect"]) for lb in labels] == [
        ("sm_clock_drop", "gpu00005", "1001", "drain"),
        ("thermal_throttle", "gpu00040", "1002", "straggler"),
        ("xid", "gpu00050", "1003", "drain"),
        ("nic_port_down", "gpu00036", "1002", "drain"),  # a port of an allocated node, 20 s
    ]
    assert labels[3]["port"] == "mlx5_3/1"


def test_a_silent_agent_sends_nothing_while_its_gpus_run_on() -> None:
    doc = {
        "fleet": {"nodes": 2, "gpus_per_node": 2, "interval_s": 5, "duration_s": 120, "seed": 2},
        "jobs": [{"job_id": "s", "gpus": 4, "first_node": 0, "warmup_s": 0}],
        "faults": [{"name": "agent_silent", "node": 1, "start_s": 30, "end_s": 60},
                   {"name": "xid", "node": 1, "gpu_index": 0, "start_s": 40,
                    "params": {"xid": 94}}],
    }  # fmt: skip
    fleet = Fleet(parse_scenario(doc))
    times: dict[int, list[int]] = {0: [], 1: []}
    xids_at: list[tuple[int, int]] = []
    for tick_ms, records in fleet.timed_ticks():
        for r in records:
            if r.stream == "samples":
                n = int(r.value["node"][-1])
                times[n].append((tick_ms - START_MS) // 1000)
                if r.value["xids"]:
                    xids_at.append((n, (tick_ms - START_MS) // 1000))
    assert [t for t in times[1] if 30 <= t < 60] == [] and len(times[0]) == 24
    assert times[1] == [t for t in range(0, 120, 5) if not 30 <= t < 60]
    assert xids_at == [(1, 60)]  # the XID of the quiet time comes with the next sample
    (silent,) = [lb for lb in fleet.labels() if lb["name"] == "agent_silent"]
    assert (silent["node"], silent["job_id"], silent["expect"]) == ("gpu00001", "s", "silent")
