"""The simulated NIC ports (producers/sim/nic.py): records, faults, their effect on the job's GPUs,
labels; and the network evaluators run on them (LinkWatch, NetworkPeers) without processes."""

from __future__ import annotations

from typing import Any

import pytest

from peerwatch.errors import ConfigError
from peerwatch.producers.nic.window import port_window
from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.schemas.codec import codec_for
from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.link_watch import LinkWatch
from peerwatch.streams.core.network_peers import NetworkPeers

T0 = 1_767_225_600_000


def doc(*faults: dict[str, Any], nics: int = 2, nodes: int = 8, duration_s: float = 120,
        confounders: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:  # fmt: skip
    return {
        "fleet": {"nodes": nodes, "gpus_per_node": 8, "duration_s": duration_s,
                  "nics_per_node": nics, "nodes_per_leaf": 4},
        "jobs": [{"job_id": "1", "gpus": 8 * nodes, "first_node": 0, "duration_s": 10_000,
                  "warmup_s": 5}],
        "faults": list(faults),
        "confounders": list(confounders),
    }  # fmt: skip


def run(scenario: dict[str, Any]) -> tuple[list[tuple[str, str, dict[str, Any]]], Fleet]:
    fleet = Fleet(parse_scenario(scenario))
    return [(r.stream, r.key, r.value) for batch in fleet.ticks() for r in batch], fleet


def link_findings(records: list[tuple[str, str, dict[str, Any]]]) -> list[dict[str, Any]]:
    alloc = AllocationTable()
    watch = LinkWatch(alloc)
    out: list[dict[str, Any]] = []
    for stream, _, value in records:
        if stream == "job-events":
            alloc.apply_event(value)
        elif stream == "nic-samples":
            out += watch.add(value)
    return out


def test_without_nics_there_are_no_nic_records() -> None:
    records, _ = run(doc(nics=0))
    assert "nic-samples" not in {s for s, _, _ in records}


def test_nic_records_encode_and_join_the_gpu_sample_of_their_tick() -> None:
    records, _ = run(doc(duration_s=10))
    codec = codec_for("NodeNicSample")
    gpu = {(k, v["ts_ms"]) for s, k, v in records if s == "samples"}
    nic = [(k, v) for s, k, v in records if s == "nic-samples"]
    assert len(nic) == len(gpu) == 8 * 10
    for key, value in nic:
        assert (key, value["ts_ms"]) in gpu
        assert codec.decode(codec.encode(value)) == value
        assert [p["name"] for p in value["ports"]] == ["mlx5_0/1", "mlx5_1/1"]
    # a healthy fleet, its PAM4 trickle and totals since boot: no link rule fires
    assert link_findings(records) == []


@pytest.mark.parametrize(("end_s", "rules"), [(33, [["link_downed"]]),
                                             (60, [["link_downed"], ["port_down"]])])  # fmt: skip
def test_a_port_down_3_s_fires_link_downed_only_and_30_s_port_down_at_7_s_too(
    end_s: float, rules: list[list[str]]
) -> None:
    records, fleet = run(doc({"name": "nic_port_down", "node": 3, "start_s": 30, "end_s": end_s,
                              "params": {"port": 1}}))  # fmt: skip
    found = link_findings(records)
    label = fleet.labels()[0]
    assert (label["expect"], label["port"]) == ("drain", "mlx5_1/1")
    assert [(f["node"], f["port"], f["hard_rules"]) for f in found] == [
        ("gpu00003", "mlx5_1/1", r) for r in rules
    ]
    assert found[0]["detected_ms"] == label["start_ms"]  # the first sample that shows it down
    if len(found) > 1:
        assert found[1]["detected_ms"] - label["start_ms"] == 8000  # passes 7 s at the 8th s


def test_a_port_down_stalls_every_gpu_of_the_job() -> None:
    records, _ = run(doc({"name": "nic_port_down", "node": 3, "start_s": 30, "end_s": 60}))

    def sm(second: int) -> float:
        ts = T0 + second * 1000
        vals = [g["sm_active_pct"] for s, _, v in records if s == "samples" and v["ts_ms"] == ts
                for g in v["gpus"]]  # fmt: skip
        return sum(vals) / len(vals)

    assert sm(45) < 0.2 * sm(20)  # the whole job waits
    assert sm(90) > 0.8 * sm(20)


@pytest.mark.parametrize(
    ("fault", "rule", "status"),
    [
        ({"name": "nic_port_flap", "params": {"flap_every_s": 10, "flap_down_s": 2}},
         "link_downed", "HARD_ERROR"),
        ({"name": "nic_symbol_errors", "params": {"errors_per_s": 300}}, "symbol_error_rate",
         "HARD_ERROR"),
        ({"name": "nic_half_rate"}, "port_below_rated", "SUSPECT"),
    ],
)  # fmt: skip
def test_link_faults_are_found_on_arrival(fault: dict[str, Any], rule: str, status: str) -> None:
    records, fleet = run(doc({**fault, "node": 5, "start_s": 40, "end_s": 100}))
    found = link_findings(records)
    assert found and {(f["node"], f["port"]) for f in found} == {("gpu00005", "mlx5_0/1")}
    assert (found[0]["hard_rules"], found[0]["status"]) == ([rule], status)
    assert found[0]["detected_ms"] - fleet.labels()[0]["start_ms"] <= 15_000


@pytest.mark.parametrize(
    "confounder",
    [
        {"name": "nic_counter_reset", "node": 2, "start_s": 50},
        {"name": "node_reboot", "node": 2, "start_s": 50, "params": {"down_s": 20}},
        {"name": "alltoall_phase", "node": 0, "start_s": 30, "end_s": 90},
        {"name": "checkpoint_traffic", "node": 0, "start_s": 30, "end_s": 90},
    ],
)
def test_confounders_fire_no_link_rule_and_name_no_port(confounder: dict[str, Any]) -> None:
    records, fleet = run(doc(confounders=(confounder,)))
    assert link_findings(records) == []
    assert fleet.labels()[0]["expect"] == "nothing"
    assert peer_findings(records) == []


def peer_findings(records: list[tuple[str, str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """NetworkPeers over 5 s windows of the job's NIC records (job-wide verdict assumed)."""
    by_node: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for stream, key, value in records:
        if stream == "nic-samples":
            for port in value["ports"]:
                by_node.setdefault(f"{key}|{port['name']}", []).append((value["ts_ms"], port))
    peers = NetworkPeers()
    out: list[dict[str, Any]] = []
    for start in range(T0 + 10_000, T0 + 115_000, 5000):
        nodes: dict[str, list[Any]] = {}
        for k, readings in by_node.items():
            node, port = k.split("|")
            nodes.setdefault(node, []).append(
                port_window(port, readings, start, start + 5000, 2000)
            )
        out += peers.window("1", start, start + 5000, nodes, gate=True)
    return out


def test_one_nodes_nic_retransmitting_is_named_by_the_peer_comparison() -> None:
    records, fleet = run(doc({"name": "nic_retransmit", "node": 6, "start_s": 40, "end_s": 110}))
    assert fleet.labels()[0]["expect"] == "network"
    assert link_findings(records) == []  # below every hard rate rule
    found = peer_findings(records)
    assert [(f["node"], f["port"], f["cause"]) for f in found] == [
        ("gpu00006", "mlx5_0/1", "NETWORK")
    ]
    assert found[0]["detected_ms"] - fleet.labels()[0]["start_ms"] <= 15_000


def test_congestion_under_one_leaf_touches_its_nodes_only() -> None:
    records, fleet = run(doc({"name": "switch_congestion", "node": 5, "start_s": 40, "end_s": 100}))
    label = fleet.labels()[0]
    assert (label["expect"], label["nodes"]) == ("switch", ["gpu00004", "gpu00005", "gpu00006",
                                                             "gpu00007"])  # fmt: skip
    cnp = {k: v["ports"][0]["hw_counters"]["np_cnp_sent"] for s, k, v in records
           if s == "nic-samples" and v["ts_ms"] == T0 + 99_000}  # fmt: skip
    assert all(cnp[f"gpu{n:05d}"] > 0 for n in range(4, 8))
    assert all(cnp[f"gpu{n:05d}"] == 0 for n in range(0, 4))


def test_a_nic_fault_needs_nics_and_a_port_that_exists() -> None:
    with pytest.raises(ConfigError) as exc:
        parse_scenario(doc({"name": "nic_port_down", "node": 1, "start_s": 1}, nics=0))
    assert exc.value.field == "faults[0].name"
    with pytest.raises(ConfigError) as exc:
        parse_scenario(
            doc({"name": "nic_port_down", "node": 1, "start_s": 1, "params": {"port": 2}})
        )
    assert exc.value.field == "faults[0].params.port"


def test_the_network_suite_labels_every_nic_kind() -> None:
    from peerwatch.streams.tools.eval_suites import network

    fleet = Fleet(parse_scenario(network(1).doc))
    labels = {(lb["name"], lb.get("port"), lb["end_ms"] - lb["start_ms"]): lb["expect"]
              for lb in fleet.labels()}  # fmt: skip
    assert labels == {
        ("nic_port_down", "mlx5_2/1", 3000): "drain",
        ("nic_port_down", "mlx5_5/1", 30_000): "drain",
        ("nic_port_flap", "mlx5_1/1", 120_000): "drain",
        ("nic_symbol_errors", "mlx5_4/1", 100_000): "drain",
        ("nic_half_rate", "mlx5_6/1", 400_000): "network",
        ("nic_retransmit", "mlx5_3/1", 700_000 - 318_000): "network",  # onset 300 + 18 s
        ("switch_congestion", None, 120_000): "switch",
        ("alltoall_phase", None, 60_000): "nothing",
        ("checkpoint_traffic", None, 50_000): "nothing",
        ("nic_counter_reset", None, 500_000): "nothing",
        ("node_reboot", None, 780_000): "nothing",
    }


def switch_findings(
    records: list[tuple[str, str, dict[str, Any]]], nodes_n: int = 16
) -> list[dict[str, Any]]:
    """SwitchWatch.window over 5 s windows of every node's simulated ports (leaves of 4)."""
    from peerwatch.streams.core.switch_watch import SwitchWatch
    from peerwatch.streams.core.topology import parse_topology

    topo = parse_topology("".join(f"SwitchName=leaf{i // 4:02d} Nodes=gpu[{i:05d}-{i + 3:05d}]\n"
                                  for i in range(0, nodes_n, 4)))  # fmt: skip
    series: dict[tuple[str, str], list[tuple[int, dict[str, Any]]]] = {}
    for stream, key, value in records:
        if stream == "nic-samples":
            for port in value["ports"]:
                series.setdefault((key, port["name"]), []).append((value["ts_ms"], port))
    watch = SwitchWatch(topo)
    jobs: dict[str, str | None] = {f"gpu{n:05d}": "1" for n in range(nodes_n)}
    out: list[dict[str, Any]] = []
    for start in range(T0 + 10_000, T0 + 115_000, 5000):
        nodes: dict[str, list[Any]] = {}
        for (node, port), readings in series.items():
            nodes.setdefault(node, []).append(
                port_window(port, readings, start, start + 5000, 2000)
            )
        out += watch.window(start + 5000, nodes, jobs)
    return out


def test_congestion_under_half_a_job_names_its_leaf_switch_once() -> None:
    records, _ = run(doc({"name": "switch_congestion", "node": 5, "start_s": 40, "end_s": 100},
                         nodes=16))  # fmt: skip
    found = switch_findings(records)
    assert [(f["switch"], f["status"], f["node"]) for f in found] == [
        ("leaf01", "FLEET_WIDE", None)
    ]
    # the job's own comparison names the four nodes under it (alerts, never drains); they are
    # all under the switch's leaf, so the wiring can fold them into the switch finding
    named_nodes = {f["node"] for f in peer_findings(records)}
    assert named_nodes == {"gpu00004", "gpu00005", "gpu00006", "gpu00007"}


def test_an_all_to_all_phase_of_the_whole_job_names_no_switch() -> None:
    records, _ = run(doc(confounders=({"name": "alltoall_phase", "node": 0, "start_s": 30,
                                       "end_s": 90},), nodes=16))  # fmt: skip
    assert switch_findings(records) == []
