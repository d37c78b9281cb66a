"""The network line of a job's report: the ports the stream named, their recommendation, and
their seconds down / flaps / error rate from the nodes' NIC samples; hostile text escaped."""

from __future__ import annotations

import json
from typing import Any

from peerwatch.exporters.report import render_job_report, render_report
from peerwatch.job_view import render_text
from peerwatch.producers.nic.counters import downtime
from peerwatch.report.job_summary import summarize_job
from peerwatch.report.network import PortTotals, line_text, network_nodes, network_ports

T0 = 1_796_000_000_000
JOB = "7001"
NODE, PORT = "gpu00003", "mlx5_2/1"


def link_finding(t_ms: int, *, node: str = NODE, port: str = PORT, **extra: Any) -> dict:
    """As LinkWatch publishes one: HARD_ERROR, no GPU, the port and the rules."""
    return {
        "finding_id": f"link-{node}-{port}-{t_ms}", "job_id": JOB, "node": node,
        "gpu_index": None, "gpu_uuid": None, "status": "HARD_ERROR",
        "window_start_ms": t_ms - t_ms % 10_000, "window_end_ms": t_ms - t_ms % 10_000 + 10_000,
        "features": [], "hard_rules": ["port_down", "link_downed"], "windows_flagged": 1,
        "windows_considered": 1, "first_flagged_ms": t_ms, "peer_group_size": 1,
        "reason": f"link {port}: port_down, link_downed", "cause": "NETWORK",
        "detected_ms": t_ms, "port": port, "switch": None, **extra,
    }  # fmt: skip


def recommendation(t_ms: int, *, node: str = NODE, port: str = PORT) -> dict[str, Any]:
    return {
        "recommendation_id": f"r-{node}", "node": node, "ts_ms": t_ms, "action": "DRAIN",
        "severity": "CRITICAL", "hard": True, "reason": f"link {port}: port_down",
        "gpu_indices": [], "job_ids": [JOB], "partition": "gpu", "evidence": [],
        "expires_ms": t_ms + 3_600_000, "cause": "NETWORK", "port": port,
    }  # fmt: skip


def nic_sample(node: str, ts_ms: int, up: bool, symbol_error: int) -> dict[str, Any]:
    port = {
        "name": PORT, "kind": "IB", "device": "mlx5_2", "port": 1, "link_layer": "InfiniBand",
        "state": "ACTIVE" if up else "DOWN", "phys_state": "LinkUp" if up else "Polling",
        "up": up, "rate_gbps": 400.0, "pci_address": None, "numa_node": None,
        "gpu_indices": [2], "counters": {"symbol_error": symbol_error}, "hw_counters": {},
        "read_errors": 0,
    }  # fmt: skip
    return {"node": node, "ts_ms": ts_ms, "seq": ts_ms // 1000, "agent_run_id": "r",
            "interval_ms": 1000, "ports": [port], "read_errors": 0}  # fmt: skip


def job_started() -> dict[str, Any]:
    return {"job_id": JOB, "kind": "STARTED", "ts_ms": T0, "start_ms": T0, "user": "ana",
            "allocations": [{"node": f"gpu0000{i}", "gpu_indices": list(range(8))}
                            for i in range(4)]}  # fmt: skip


def states() -> list[bool]:
    return [True] * 10 + [False] * 9 + [True] * 11  # down from 10 s to 19 s


def totals() -> PortTotals:
    t = PortTotals(frozenset({NODE}), T0, T0 + 3_600_000)
    for i, up in enumerate(states()):
        t.add(nic_sample(NODE, T0 + i * 1000, up, symbol_error=100 + 2 * i))
        t.add(nic_sample("gpu00001", T0 + i * 1000, True, 0))  # not a named node: ignored
    return t


def test_the_named_ports_fold_their_nic_samples_with_the_counter_arithmetic() -> None:
    t = totals()
    windows = t.windows()
    assert set(windows) == {(NODE, PORT)}
    whole = downtime([(T0 + i * 1000, up) for i, up in enumerate(states())], T0 + 1,
                     T0 + 29_001, 2000)  # fmt: skip
    assert windows[(NODE, PORT)].down_s == whole.down_s == 9.0
    [line] = network_ports(JOB, [link_finding(T0 + 17_000)], [recommendation(T0 + 17_500)],
                           windows)  # fmt: skip
    assert (line.node, line.port, line.statuses, line.action) == (NODE, PORT, ("HARD_ERROR",),
                                                                  "DRAIN")  # fmt: skip
    assert (line.down_s, line.flaps, line.errors_per_s) == (9.0, 1, 2.0)
    assert line.rules == ("link_downed", "port_down")
    assert line_text(line).startswith(
        f"{NODE} {PORT}: HARD_ERROR (link_downed, port_down); drain recommended; down 9.0 s, "
        "1 flap, 2.0 errors/s"
    )


def test_only_network_records_of_the_job_naming_a_port_or_switch_make_lines() -> None:
    other_job = link_finding(T0, node="gpu00009") | {"job_id": "9999"}
    gpu = link_finding(T0) | {"cause": "THERMAL", "port": None}
    no_port = link_finding(T0) | {"port": None}
    switch = link_finding(T0, node=None, port=None) | {"status": "FLEET_WIDE", "switch": "leaf2"}
    lines = network_ports(JOB, [other_job, gpu, no_port, switch, "junk", 7], [])
    assert [(x.node, x.port, x.switch) for x in lines] == [(None, None, "leaf2")]
    assert line_text(lines[0]).startswith("leaf switch leaf2: FLEET_WIDE")
    assert network_nodes(JOB, [other_job, link_finding(T0)], [recommendation(T0, node="gpu7")]) == {
        NODE, "gpu7"
    }  # fmt: skip


def test_hostile_nic_samples_are_skipped_and_counted() -> None:
    t = PortTotals(frozenset({NODE}), None, None)
    for bad in ({"node": NODE}, {"node": NODE, "ts_ms": T0, "ports": [{"no": "name"}]},
                {"node": NODE, "ts_ms": T0, "ports": 5}, None, "x"):  # fmt: skip
        t.add(bad)
    assert t.skipped == 3 and t.windows() == {}


def test_the_job_summary_carries_the_network_line_into_its_verdict_json_and_views() -> None:
    hostile = "mlx5_2/1\x1b[2J<script>alert(1)</script>"
    findings = [link_finding(T0 + 17_000), link_finding(T0 + 17_000, port=hostile)]
    s = summarize_job(JOB, findings=findings, recommendations=[recommendation(T0 + 17_500)],
                      job_events=[job_started()], nic_ports=totals().windows())  # fmt: skip
    assert [x.port for x in s.network] == [PORT, hostile]  # the drained port first
    assert s.verdict.endswith(
        f"; network: {NODE} {PORT}: HARD_ERROR (link_downed, port_down); drain recommended; "
        "down 9.0 s, 1 flap, 2.0 errors/s (+1 more port(s))"
    )
    assert json.loads(json.dumps(s.to_json()))["network"][0]["down_s"] == 9.0
    text = render_text(s, width=160)
    assert "Network: ports of the job's nodes the stream named" in text
    assert f"{NODE} {PORT}: HARD_ERROR" in text
    assert "\x1b" not in text  # the hostile port name is escaped for the terminal
    page = render_job_report(s, [], findings, s.recommendations, [("job-events", job_started())])
    assert '<table class="network">' in page and "<script>alert(1)" not in page
    assert "&lt;script&gt;" in page


def test_the_replay_report_shows_a_jobs_network_line() -> None:
    page = render_report([], [link_finding(T0 + 17_000)], [recommendation(T0 + 17_500)],
                         [("job-events", job_started())])  # fmt: skip
    assert '<table class="network">' in page
    assert f'data-node="{NODE}" data-port="{PORT}"' in page and "drain recommended" in page
