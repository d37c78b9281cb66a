"""The Slurm switch layout (topology) and the leaf-switch grouping of network symptoms
(switch_watch)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from peerwatch.errors import ConfigError
from peerwatch.producers.nic.window import PortWindow
from peerwatch.producers.slurm.command import CommandResult, SlurmCommands
from peerwatch.schemas.codec import codec_for
from peerwatch.streams.core.policy import DrainPolicyState, apply
from peerwatch.streams.core.settings import NetworkSettings
from peerwatch.streams.core.switch_watch import SwitchWatch, symptoms_of
from peerwatch.streams.core.topology import (
    Topology,
    live_topology,
    load_topology,
    parse_topology,
    read_topology,
)

DATA = Path(__file__).parents[1] / "data" / "slurm" / "topology"


@pytest.mark.parametrize("name", ["scontrol-show-topology.txt", "topology.conf"])
def test_both_sources_give_the_same_leaves(name: str) -> None:
    topo = parse_topology((DATA / name).read_text())
    assert topo.problems == ()
    assert sorted(topo.switches) == ["leaf01", "leaf02", "leaf03", "leaf04", "spine01"]
    assert [s for s, sw in sorted(topo.switches.items()) if sw.is_leaf] == [
        "leaf01", "leaf02", "leaf03", "leaf04"
    ]  # fmt: skip
    assert topo.switches["spine01"].switches == ("leaf01", "leaf02", "leaf03", "leaf04")
    assert len(topo.leaf_of) == 128
    assert (topo.leaf("gpu001"), topo.leaf("gpu032"), topo.leaf("gpu033")) == (
        "leaf01", "leaf01", "leaf02"
    )  # fmt: skip
    assert topo.leaf("gpu999") is None
    assert topo.groups(["gpu040", "gpu001", "x", "gpu002"]) == {
        "leaf01": ["gpu001", "gpu002"], "leaf02": ["gpu040"], None: ["x"]
    }  # fmt: skip


def test_levels_and_link_speeds_of_scontrol_output() -> None:
    topo = parse_topology((DATA / "scontrol-show-topology.txt").read_text())
    assert (topo.switches["leaf01"].level, topo.switches["spine01"].level) == (0, 1)
    conf = parse_topology((DATA / "topology.conf").read_text())
    assert (conf.switches["leaf01"].level, conf.switches["leaf02"].link_speed) == (None, 400)


def test_the_real_output_without_a_topology_plugin_is_an_empty_layout() -> None:
    topo = parse_topology((DATA / "scontrol-show-topology-none.txt").read_text())
    assert (dict(topo.switches), dict(topo.leaf_of), topo.problems) == ({}, {}, ())


def test_read_topology_runs_an_argument_vector() -> None:
    seen: list[list[str]] = []

    def runner(argv: Any, timeout_s: float) -> CommandResult:
        seen.append(list(argv))
        return CommandResult(0, (DATA / "scontrol-show-topology.txt").read_text(), "")

    topo = read_topology(SlurmCommands(runner=runner))
    assert seen == [["scontrol", "show", "topology"]]
    assert len(topo.leaf_of) == 128


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("SwitchName=s0 Level=0 LinkSpeed=1 Nodes=gpu[001-0", "unclosed"),  # SLURM_TOPO_LEN cut
        ("Level=0 Nodes=gpu1", "no SwitchName"),
        ("SwitchName=s0;rm Nodes=gpu1", "characters outside"),
        ("SwitchName=s0 Nodes=gpu1,\x1bred\u202e", "characters outside"),
        ("SwitchName=s0 Nodes=gpu1,\x1b[31mred", "unclosed"),
        ("SwitchName=s0 Level=x Nodes=gpu1", "Level"),
        ("SwitchName=s0 Level=0 Level=1", "twice"),
        ("SwitchName=s0 junk", "not key=value"),
        ("SwitchName=s0 Nodes=gpu[9-1]", "backwards"),
    ],
)
def test_a_bad_line_is_skipped_with_its_problem_and_the_rest_kept(line: str, problem: str) -> None:
    text = f"SwitchName=ok Level=0 LinkSpeed=1 Nodes=gpu[1-2]\n{line}\n"
    topo = parse_topology(text)
    assert topo.leaf("gpu1") == "ok"
    assert len(topo.problems) == 1 and problem in topo.problems[0]
    assert "line 2" in topo.problems[0]
    assert topo.problems[0].isascii() and topo.problems[0].isprintable()  # escaped


def test_a_node_under_two_leaves_stays_under_the_first() -> None:
    topo = parse_topology(
        "SwitchName=a Nodes=n[1-2]\nSwitchName=b Nodes=n[2-3]\nSwitchName=a Nodes=n9\n"
    )
    assert (topo.leaf("n2"), topo.leaf("n3"), topo.leaf("n9")) == ("a", "b", None)
    assert len(topo.problems) == 2


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_any_text_parses_without_raising(text: str) -> None:
    topo = parse_topology(text)
    for node, leaf in topo.leaf_of.items():
        assert node in topo.switches[leaf].nodes


# -- SwitchWatch ----------------------------------------------------------------------------------
TOPO = parse_topology((DATA / "scontrol-show-topology.txt").read_text())


def link_finding(node: str, ts: int, rule: str = "port_xmit_discards_rate", job: str = "1") -> dict:
    return {"node": node, "detected_ms": ts, "cause": "NETWORK", "hard_rules": [rule],
            "features": [], "job_id": job, "port": "mlx5_0/1"}  # fmt: skip


def test_two_nodes_under_one_leaf_in_different_jobs_make_one_switch_finding() -> None:
    w = SwitchWatch(TOPO)
    assert w.add_finding(link_finding("gpu001", 10_000, job="1")) == []
    assert w.add_finding(link_finding("gpu040", 11_000, job="3")) == []  # another leaf
    found = w.add_finding(link_finding("gpu017", 20_000, job="2"))
    assert [(f["switch"], f["status"], f["cause"], f["node"], f["hard_rules"]) for f in found] == [
        ("leaf01", "FLEET_WIDE", "NETWORK", None, ["port_xmit_discards_rate"])
    ]
    f = found[0]
    assert "gpu001, gpu017" in f["reason"] and "jobs 1, 2" in f["reason"]
    assert f["peer_group_size"] == 32
    codec = codec_for("StragglerFinding")
    assert codec.decode(codec.encode(f)) == f
    # alert only: the policy recommends nothing for it (no node to drain)
    assert apply(f, DrainPolicyState()) == []
    # the storm goes on: no second finding; the symptom is explained by the switch
    assert w.add_finding(link_finding("gpu018", 25_000)) == []
    assert (w.explains("gpu017", 26_000), w.explains("gpu040", 26_000)) == ("leaf01", None)


def test_symptoms_too_far_apart_or_different_do_not_group() -> None:
    w = SwitchWatch(TOPO, NetworkSettings(switch_window_s=60))
    w.add_finding(link_finding("gpu001", 0))
    assert w.add_finding(link_finding("gpu002", 61_000)) == []
    assert w.add_finding(link_finding("gpu003", 62_000, rule="symbol_error_rate")) == []
    assert [f["switch"] for f in w.add_finding(link_finding("gpu004", 100_000))] == ["leaf01"]


def test_peer_features_count_as_symptoms_and_unplaced_nodes_are_counted() -> None:
    peer = {"node": "gpu100", "detected_ms": 5000, "cause": "NETWORK", "hard_rules": [],
            "features": [{"feature": "net_wait"}], "job_id": "9"}  # fmt: skip
    assert symptoms_of(peer) == ["net_wait"]
    assert symptoms_of({**peer, "cause": "THERMAL"}) == []
    w = SwitchWatch(TOPO)
    w.add_finding(peer)
    assert w.add_finding({**peer, "node": "elsewhere"}) == []
    assert w.unplaced == 1
    assert [f["switch"] for f in w.add_finding({**peer, "node": "gpu101"})] == ["leaf04"]


def test_a_switch_fires_again_after_repeat_after_s_of_quiet() -> None:
    w = SwitchWatch(TOPO, NetworkSettings(repeat_after_s=120))
    first = w.add_finding(link_finding("gpu001", 0)) + w.add_finding(link_finding("gpu002", 1000))
    again = w.add_finding(link_finding("gpu003", 200_000)) + w.add_finding(
        link_finding("gpu004", 201_000)
    )
    assert [f["detected_ms"] for f in first + again] == [1000, 201_000]


def test_snapshot_restore_and_prune() -> None:
    a = SwitchWatch(TOPO)
    a.add_finding(link_finding("gpu001", 0))
    b = SwitchWatch(TOPO)
    b.restore(json.loads(json.dumps(a.snapshot())))
    assert b.add_finding(link_finding("gpu002", 1000)) == a.add_finding(
        link_finding("gpu002", 1000)
    )
    assert a.prune(500) == 1
    assert a.prune(10**9) == 1
    assert a.snapshot() == {"seen": [], "fired": []}


def pw(port: str = "mlx5_0/1", wait: float = 0.01) -> PortWindow:
    rates = {"port_xmit_wait": wait * 50e9 / 8, "port_xmit_data": 20e9, "port_rcv_data": 20e9}
    return PortWindow(port, 0, 5000, 5, rates, 0.0, 0.0, 0, (), (), 400.0)


def fleet_window(waiting: set[str], jobs: dict[str, str | None]) -> dict[str, list[PortWindow]]:
    return {n: [pw(wait=0.4 if n in waiting else 0.01 * (1 + i % 3 / 10))]
            for i, n in enumerate(sorted(jobs))}  # fmt: skip


def test_the_fleet_window_names_the_switch_of_congestion_over_half_a_job() -> None:
    jobs: dict[str, str | None] = {f"gpu{i:03d}": "A" if i <= 16 else "B" for i in range(1, 41)}
    waiting = {f"gpu{i:03d}": None for i in range(9, 13)}  # under leaf01, half of job A's there
    w = SwitchWatch(TOPO)
    found = w.window(5000, fleet_window(set(waiting), jobs), jobs)
    assert [(f["switch"], f["hard_rules"], f["windows_flagged"]) for f in found] == [
        ("leaf01", ["net_wait"], 4)
    ]


def test_a_whole_job_standing_out_is_its_own_traffic_not_the_switch() -> None:
    jobs: dict[str, str | None] = {f"gpu{i:03d}": "A" if i <= 4 else "B" for i in range(1, 41)}
    all_to_all = {f"gpu{i:03d}" for i in range(1, 5)}  # job A entire, under leaf01
    assert SwitchWatch(TOPO).window(5000, fleet_window(all_to_all, jobs), jobs) == []


def test_lighter_traffic_of_another_job_is_no_switch_symptom() -> None:
    """Jobs differ in traffic: two nodes of a lighter job under one leaf stand out against the
    fleet on throughput only, which says nothing about their switch (the fleet comparison
    counted net_rx/net_tx as symptoms before, and named leaf01)."""
    jobs: dict[str, str | None] = {f"gpu{i:03d}": "A" if i in (1, 2) else "B" for i in range(1, 41)}
    window = fleet_window(set(), jobs)
    for n in ("gpu001", "gpu002"):
        rates = {**window[n][0].rates_per_s, "port_xmit_data": 2e9, "port_rcv_data": 2e9}
        window[n] = [PortWindow("mlx5_0/1", 0, 5000, 5, rates, 0.0, 0.0, 0, (), (), 400.0)]
    jobs["gpu003"] = "A"  # job A has a node that does not stand out: not "its own traffic"
    assert SwitchWatch(TOPO).window(5000, window, jobs) == []


def test_network_topology_names_none_a_file_or_scontrol(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert load_topology("") == Topology()
    conf = tmp_path / "topology.conf"
    conf.write_text((DATA / "topology.conf").read_text())
    assert load_topology(str(conf)).leaf_of == TOPO.leaf_of

    def runner(argv: Any, timeout_s: float) -> CommandResult:
        return CommandResult(0, (DATA / "scontrol-show-topology.txt").read_text(), "")

    assert load_topology("scontrol", SlurmCommands(runner=runner)).leaf_of == TOPO.leaf_of
    with pytest.raises(ConfigError, match=r"^network\.topology: cannot read"):
        load_topology(str(tmp_path / "missing.conf"))

    # a worker whose scontrol fails goes on without a layout (logged)
    def failing(argv: Any, timeout_s: float) -> CommandResult:
        return CommandResult(1, "", "slurm_load_topo error: Unable to contact slurm controller")

    with caplog.at_level(logging.WARNING):
        assert live_topology("scontrol", SlurmCommands(runner=failing)) == Topology()
    assert "no switch layout" in caplog.text
