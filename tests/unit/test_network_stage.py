"""NetworkStage: the one composition of the network's rules both runners feed; the offline
pipeline routes the ``nic-samples`` stream into it and its findings through the policy."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from peerwatch.producers.nic.spans import FEATURE_COUNTERS
from peerwatch.producers.nic.window import port_window
from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.settings import Settings
from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.network_stage import NetworkStage
from peerwatch.streams.core.pipeline import FINDING, RECOMMENDATION, Pipeline
from peerwatch.streams.core.windows import ClosedWindows

T0 = 1_767_225_600_000
Records = list[tuple[str, str, dict[str, Any]]]


def port_down(start_s: float = 30, end_s: float = 40, nics: int = 2) -> tuple[Records, Fleet]:
    """An 8-node job, one port of node 3 down over ``[start_s, end_s)``."""
    fleet = Fleet(parse_scenario({
        "fleet": {"nodes": 8, "gpus_per_node": 8, "duration_s": 90, "nics_per_node": nics,
                  "nodes_per_leaf": 4},
        "jobs": [{"job_id": "1", "gpus": 64, "first_node": 0, "duration_s": 10_000,
                  "warmup_s": 5}],
        "faults": [{"name": "nic_port_down", "node": 3, "start_s": start_s, "end_s": end_s,
                    "params": {"port": 1}}],
    }))  # fmt: skip
    return [(r.stream, r.key, r.value) for batch in fleet.ticks() for r in batch], fleet


def test_a_port_down_10_s_is_found_and_drained_offline_naming_node_and_port() -> None:
    records, fleet = port_down()
    start_ms = fleet.labels()[0]["start_ms"]
    out = list(Pipeline(Settings()).run(records))
    links = [o for o in out if o.kind == FINDING and o.value["status"] == "HARD_ERROR"]
    assert [(o.value["node"], o.value["port"], o.value["hard_rules"], o.value["cause"])
            for o in links] == [("gpu00003", "mlx5_1/1", ["link_downed"], "NETWORK"),
                                ("gpu00003", "mlx5_1/1", ["port_down"], "NETWORK")]  # fmt: skip
    passing = links[1].value["detected_ms"]
    assert passing - start_ms == 8000  # the sample that shows it down past 7 s
    assert all(o.stream_ms == o.value["detected_ms"] for o in links)  # out at its sample's time
    recs = [o for o in out if o.kind == RECOMMENDATION and o.value["node"] == "gpu00003"]
    assert recs and recs[0].stream_ms <= passing + 5000
    # the link_downed rise at the first down sample already drains; the port_down adds none;
    # the stalled job (every rank waits) opens the gate and the job's own comparison names the
    # same port too (down 5 s of the window against 0): an alert, never a second drain
    peer = [o.value for o in out if o.kind == FINDING and o.value["status"] == "CONFIRMED"]
    # (its throughput too: the 64-bit data counters give rates, a down port moves nothing)
    assert [(f["node"], f["port"], [x["feature"] for x in f["features"]]) for f in peer] == [
        ("gpu00003", "mlx5_1/1", ["net_rx", "net_tx", "net_down"])
    ]
    assert [r.value["action"] for r in recs] == ["DRAIN", "ALERT"]
    assert (recs[0].value["port"], recs[0].value["cause"]) == ("mlx5_1/1", "NETWORK")
    assert recs[0].value["evidence"][0]["finding_id"] == links[0].value["finding_id"]
    assert Pipeline(Settings()).counters()["link_samples"] == 0
    nic_pipeline = Pipeline(Settings())
    list(nic_pipeline.run(records))
    assert nic_pipeline.counters()["link_samples"] == sum(s == "nic-samples" for s, _, _ in records)


def test_without_nic_samples_the_pipeline_finds_no_link_fault() -> None:
    records, _ = port_down()
    out = list(Pipeline(Settings()).run([r for r in records if r[0] != "nic-samples"]))
    assert not [o for o in out if o.kind == FINDING and o.value.get("port") is not None]


def test_a_restored_stage_finds_what_an_uninterrupted_one_finds() -> None:
    records, _ = port_down()
    nic = [v for s, _, v in records if s == "nic-samples"]
    events = [v for s, _, v in records if s == "job-events"]

    def stage() -> NetworkStage:
        alloc = AllocationTable()
        for e in events:
            alloc.apply_event(e)
        return NetworkStage(alloc)

    whole = stage().add_nic(nic)
    cut = len(nic) * 35 // 90  # mid-episode: the port went down at 30 s
    first = stage()
    head = first.add_nic(nic[:cut])
    second = stage()
    second.restore(first.snapshot())
    assert head + second.add_nic(nic[cut:]) == whole
    assert [f["hard_rules"] for f in whole] == [["link_downed"], ["port_down"]]


def test_bad_nic_samples_are_counted_and_skipped() -> None:
    stage = NetworkStage(AllocationTable())
    assert stage.add_nic([{"node": 3}, {"node": "n", "ts_ms": "x", "ports": []}]) == []
    assert stage.counters()["link_invalid_samples"] == 2


def big_job(nic_fault: bool) -> Records:
    """A 32-node job (256 GPUs) slowed job-wide from 300 s (the GPU detector's JOB_WIDE: a
    third of its GPUs lose 10 % of their clocks at once), with or without node 17's NIC
    retransmitting on mlx5_0/1 from 300 s."""
    drops = [{"name": "sm_clock_drop", "node": n, "gpu_index": g, "start_s": 300,
              "params": {"pct": 10}} for n in range(10) for g in range(8)]  # fmt: skip
    nic = [{"name": "nic_retransmit", "node": 17, "start_s": 300, "end_s": 410}]
    fleet = Fleet(parse_scenario({
        "fleet": {"nodes": 32, "gpus_per_node": 8, "duration_s": 420, "nics_per_node": 2,
                  "nodes_per_leaf": 4},
        "jobs": [{"job_id": "1", "gpus": 256, "first_node": 0, "duration_s": 10_000,
                  "warmup_s": 5}],
        "faults": drops + (nic if nic_fault else []),
    }))  # fmt: skip
    return [(r.stream, r.key, r.value) for batch in fleet.ticks() for r in batch]


def test_a_degraded_link_inside_a_32_node_job_is_named_with_cause_network() -> None:
    out = list(Pipeline(Settings(), emit_windows=False).run(big_job(nic_fault=True)))
    network = [o.value for o in out if o.kind == FINDING and o.value["cause"] == "NETWORK"]
    assert [(f["node"], f["port"], f["status"], f["gpu_index"]) for f in network] == [
        ("gpu00017", "mlx5_0/1", "CONFIRMED", None)
    ]
    assert network[0]["detected_ms"] - (T0 + 300_000) <= 15_000
    assert [o.value["status"] for o in out if o.kind == FINDING and o.value["cause"] != "NETWORK"
            ] == ["JOB_WIDE"]  # fmt: skip
    recs = [o.value for o in out if o.kind == RECOMMENDATION and o.value["node"] == "gpu00017"]
    # a job-wide slowdown never drains: the link is named in an alert
    assert {(r["action"], r["cause"], r["port"]) for r in recs} >= {
        ("ALERT", "NETWORK", "mlx5_0/1")
    }
    assert all(r["action"] != "DRAIN" for r in recs)


def test_a_job_wide_slowdown_without_a_link_that_stands_out_names_no_port() -> None:
    out = list(Pipeline(Settings(), emit_windows=False).run(big_job(nic_fault=False)))
    assert [o.value["status"] for o in out if o.kind == FINDING] == ["JOB_WIDE"]


def _closed(start: int, end: int, owner: dict[str, str]) -> ClosedWindows:
    """The aggregator's closed columns of one window start: one slot per GPU of each node."""
    names = sorted(owner)
    code = {j: i for i, j in enumerate(sorted(set(owner.values())))}
    node = np.repeat(np.arange(len(names)), 8)
    job = np.repeat(np.array([code[owner[n]] for n in names]), 8)
    jobs = {i: (j, None, None, None) for j, i in code.items()}
    return ClosedWindows(start, end, {"job": job}, node, np.tile(np.arange(8), len(names)),
                         names, jobs, {})  # fmt: skip


def test_closed_summarises_the_kept_readings_of_the_features_counters_only() -> None:
    """Each job's ports at a close are the window of the readings kept, over the counters the
    network features read (:data:`FEATURE_COUNTERS`: the packet counters the simulator also
    sends are summarised by no one); a restored stage gives the same."""
    records, _ = port_down()
    nic = [v for s, _, v in records if s == "nic-samples"]
    alloc = AllocationTable()
    for e in (v for s, _, v in records if s == "job-events"):
        alloc.apply_event(e)
    stage = NetworkStage(alloc, readings_ms=60_000)
    stage.add_nic(nic[: len(nic) * 50 // 90])
    start = T0 + 30_000  # 30..35 s in: node 3's port is down
    twin = NetworkStage(AllocationTable.from_dict(alloc.to_dict()), readings_ms=60_000)
    twin.restore(json.loads(json.dumps(stage.snapshot())))
    part = _closed(start, start + 5000, {f"gpu{n:05d}": "1" for n in range(8)})
    ports, switches = stage.closed([part])
    assert (ports, switches) == twin.closed([part])
    assert [(p.job_id, p.start_ms, sorted(p.nodes)) for p in ports] == [
        ("1", start, [f"gpu{n:05d}" for n in range(8)])
    ]
    for node, windows in ports[0].nodes.items():
        kept = stage.readings[node]
        assert windows == tuple(
            port_window(name, kept[name], start, start + 5000, 2000, FEATURE_COUNTERS)
            for name in sorted(kept)
        )
        for w in windows:
            assert w.readings == 5 and set(w.rates_per_s) <= FEATURE_COUNTERS
            assert "port_xmit_data" in w.rates_per_s and "port_xmit_packets" not in w.rates_per_s
    assert ports[0].nodes["gpu00003"][1].down_s == 5.0


def test_the_readings_kept_are_those_within_readings_ms_of_the_newest() -> None:
    """A port keeps its readings of the last ``readings_ms`` behind its newest one, in time
    order (the old ones trimmed as new ones come; late ones dropped)."""
    records, _ = port_down()
    nic = [v for s, _, v in records if s == "nic-samples"]
    stage = NetworkStage(AllocationTable(), readings_ms=10_000)
    stage.add_nic(nic)
    stage.add_nic(nic[:50])  # late: dropped
    for node, ports in stage.readings.items():
        newest = max(int(s["ts_ms"]) for s in nic if s["node"] == node)
        want = sorted({int(s["ts_ms"]) for s in nic if s["node"] == node
                       and int(s["ts_ms"]) >= newest - 10_000})  # fmt: skip
        for series in ports.values():
            assert [t for t, _ in series] == want
