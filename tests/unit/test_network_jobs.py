"""The network's stage 2 -> 3 record (network_jobs): JobPorts as a JSON message, checked as
hostile input; the offline pipeline's switch grouping and per-job naming from the same records."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from peerwatch.producers.nic.window import PortWindow
from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.nic import topology_conf
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.settings import Settings
from peerwatch.streams.core.network_jobs import (
    JobPorts,
    job_ports_json,
    job_ports_messages,
    job_ports_of_json,
)
from peerwatch.streams.core.pipeline import FINDING, RECOMMENDATION, Pipeline
from peerwatch.streams.core.topology import parse_topology


def ports() -> JobPorts:
    pw = PortWindow("mlx5_0/1", 5000, 10_000, 5, {"port_xmit_wait": 12.5, "symbol_error": 0.05},
                    0.0, 1.0, 0, ("symbol_error",), (), 400.0)  # fmt: skip
    return JobPorts("7501", 5000, 10_000, {"gpu00001": (pw,), "gpu00002": (pw,)},
                    {"gpu00002": "leaf0"})  # fmt: skip


def test_the_message_round_trips_through_json() -> None:
    jp = ports()
    assert job_ports_of_json(json.loads(json.dumps(job_ports_json(jp)))) == jp


def _set(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    m = job_ports_json(ports())
    at: Any = m
    for k in path[:-1]:
        at = at[k]
    at[path[-1]] = value
    return m


PORT = ("nodes", "gpu00001", 0)


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (_set(("kind",), "census"), ValueError),
        (_set(("job_id",), ""), ValueError),
        (_set(("job_id",), 7501), ValueError),
        (_set(("start",), -1), ValueError),
        (_set(("start",), True), ValueError),
        (_set(("end",), 5000), ValueError),
        (_set(("nodes",), []), TypeError),
        (_set(("nodes", "x" * 200), []), ValueError),
        (_set(("nodes", "gpu00001"), {"a": 1}), TypeError),
        (_set(("nodes", "gpu00001"), ["x"] * 65), TypeError),
        (_set((*PORT, "start_ms"), 0), ValueError),
        (_set((*PORT, "rates_per_s", "symbol_error"), float("nan")), ValueError),
        (_set((*PORT, "rates_per_s", "symbol_error"), -1.0), ValueError),
        (_set((*PORT, "rates_per_s", "symbol_error"), "1"), TypeError),
        (_set((*PORT, "rates_per_s"), {f"c{i}": 1.0 for i in range(300)}), TypeError),
        (_set((*PORT, "down_s"), -2.0), ValueError),
        (_set((*PORT, "flaps"), 1.5), ValueError),
        (_set((*PORT, "resets"), [""]), ValueError),
        (_set((*PORT, "min_rate_gbps"), float("inf")), ValueError),
        (_set(("switched", "gpu00002"), None), ValueError),
        ({"kind": "network"}, KeyError),
    ],
)
def test_a_hostile_message_is_refused_naming_what_is_wrong(
    message: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        job_ports_of_json(message)


def test_a_big_job_s_window_is_split_into_messages_under_the_limit_whole_nodes_each() -> None:
    pw = ports().nodes["gpu00001"][0]
    nodes = {f"gpu{i:05d}": (pw, PortWindow("mlx5_1/1", 5000, 10_000, 5, {}, 0.0, 0.0, 0, (), (),
                                            None)) for i in range(500)}  # fmt: skip
    jp = JobPorts("7501", 5000, 10_000, nodes, {"gpu00007": "leaf0", "gpu00400": "leaf9"})
    sent = job_ports_messages(jp, max_bytes=64 * 1024)
    assert len(sent) > 1 and all(len(m) <= 64 * 1024 + 2048 for m in sent)
    got = [job_ports_of_json(json.loads(m)) for m in sent]
    assert {n: p for g in got for n, p in g.nodes.items()} == nodes
    assert {n: s for g in got for n, s in g.switched.items()} == jp.switched
    assert all(set(g.switched) <= set(g.nodes) for g in got)
    assert job_ports_messages(JobPorts("1", 0, 5000, {})) == [
        json.dumps(job_ports_json(JobPorts("1", 0, 5000, {}))).encode()
    ]


def test_a_port_given_twice_is_refused() -> None:
    m = job_ports_json(ports())
    m["nodes"]["gpu00001"].append(copy.deepcopy(m["nodes"]["gpu00001"][0]))
    with pytest.raises(ValueError, match="given twice"):
        job_ports_of_json(m)


def congestion(seed: int = 1) -> tuple[list[dict[str, Any]], int]:
    """Two 8-node jobs, 4 nodes a leaf; congestion under the leaf of nodes 4-7 (half of job
    7501) from 120 s to 240 s: every NETWORK finding, and the onset (epoch ms)."""
    doc = {
        "fleet": {"nodes": 16, "gpus_per_node": 8, "duration_s": 300, "seed": seed,
                  "nics_per_node": 2, "nodes_per_leaf": 4},
        "jobs": [{"job_id": "7501", "gpus": 64, "first_node": 0, "duration_s": 7200},
                 {"job_id": "7502", "gpus": 64, "first_node": 8, "duration_s": 7200}],
        "faults": [{"name": "switch_congestion", "node": 4, "start_s": 120, "end_s": 240}],
    }  # fmt: skip
    fleet = Fleet(parse_scenario(doc))
    layout = parse_topology(topology_conf(16, 4, fleet.spec.node_name))
    records = ((r.stream, r.key, r.value) for batch in fleet.ticks() for r in batch)
    out = list(Pipeline(Settings(), emit_windows=False, topology=layout).run(records))
    assert not [o for o in out if o.kind == RECOMMENDATION and o.value["action"] == "DRAIN"]
    found = [o.value for o in out if o.kind == FINDING and o.value["cause"] == "NETWORK"]
    return found, int(fleet.labels()[0]["start_ms"])


def test_congestion_under_one_leaf_is_one_finding_naming_the_switch_and_no_node() -> None:
    found, onset = congestion()
    assert [(f["switch"], f["node"], f["status"], f["job_id"]) for f in found] == [
        ("leaf1", None, "FLEET_WIDE", "fleet")
    ]
    assert found[0]["hard_rules"] in (["net_cnp"], ["net_wait"])
    assert 0 <= found[0]["detected_ms"] - onset <= 15_000
