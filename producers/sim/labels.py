"""Ground truth for a scenario: one label per injected fault and confounder.

A label is a JSON-ready dict::

    {"kind": "fault" | "confounder", "name": str, "node": str | None, "gpu_index": int | None,
     "job_id": str | None, "start_ms": int, "end_ms": int, "expect": "straggler" | "drain" |
     "silent" | "nothing", "params": {...}}

``job_id`` is the job that owned the GPU (any GPU of the node when ``gpu_index`` is None) at onset;
times are epoch ms on the true clock. What the detector should conclude (DETECTION.md):

- clock faults (``sm_clock_drop`` of >= 5%, ``thermal_throttle``, ``power_brake``) on a GPU of a
  job with >= 8 GPUs: ``straggler``, or ``drain`` when they overlap the job for >= 10 minutes;
  elsewhere (idle GPU, small job, a drop under 5%): ``nothing``;
- hard errors (hardware XIDs, NVLink storm, PCIe downtrain, GPU lost): ``drain``; application XIDs
  (13, 31, 43, 45, 68) and unknown codes: ``nothing``;
- ``agent_silent`` (a node's samples stop): ``silent`` while a job owns the node, else
  ``nothing`` (an idle node is not watched);
- every confounder: ``nothing``;
- NIC faults (``nic.py``; their labels also carry ``port``): a port down (however short: its
  ``link_downed`` rises at once; past ``PORT_DOWN_MS`` on an allocated node ``port_down`` fires
  too), a flapping port and a symbol-error burst above ``SYMBOL_ERRORS_PER_S``: ``drain`` (hard
  link rules on arrival); a smaller burst: ``nothing``; a link trained at half rate and one node's
  NIC retransmitting inside a job of >= ``MIN_NETWORK_NODES`` nodes: ``network`` (a finding with
  cause NETWORK naming node and port, never a drain); congestion under one leaf switch:
  ``switch`` (one finding naming the switch; the label also lists the leaf's ``nodes``).
"""

from __future__ import annotations

from typing import Any

from peerwatch.producers.sim.nic import NIC_CONFOUNDERS, NIC_FAULTS, leaf_nodes
from peerwatch.producers.sim.scenario import Injection, Scenario
from peerwatch.producers.sim.scheduler import JobRun, Schedule

HARD_XIDS = frozenset({48, 63, 64, 74, 79, 92, 94, 95})
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68})
CLOCK_FAULTS = frozenset({"sm_clock_drop", "thermal_throttle", "power_brake"})
HARD_FAULTS = frozenset({"nvlink_error_storm", "pcie_downtrain", "gpu_lost"})
MIN_PEER_GROUP = 8
MIN_STRAGGLER_DROP_PCT = 5.0
DRAIN_AFTER_MS = 10 * 60 * 1000
#: network.port_down_s (NCCL's IB timeout), network.symbol_error_per_s, network.peer_min_nodes
PORT_DOWN_MS = 7000
SYMBOL_ERRORS_PER_S = 10.0
MIN_NETWORK_NODES = 4


def _nic_expect(inj: Injection, job_nodes: int, overlap_ms: int) -> str:
    if inj.name in ("nic_port_down", "nic_port_flap"):
        return "drain"  # the port's link_downed rises at the first outage, however short
    if inj.name == "nic_symbol_errors":
        return "drain" if inj.param("errors_per_s", 200.0) > SYMBOL_ERRORS_PER_S else "nothing"
    if inj.name in ("nic_half_rate", "nic_retransmit"):
        return "network" if job_nodes >= MIN_NETWORK_NODES and overlap_ms > 0 else "nothing"
    if inj.name == "switch_congestion":
        return "switch"
    return "nothing"


def _expect(inj: Injection, job_gpus: int, overlap_ms: int) -> str:
    if inj.kind == "confounder":
        return "nothing"
    if inj.name == "agent_silent":
        return "silent" if overlap_ms > 0 else "nothing"
    if inj.name in HARD_FAULTS:
        return "drain"
    if inj.name == "xid":
        return "drain" if int(inj.param("xid", 79)) in HARD_XIDS else "nothing"
    if inj.name in CLOCK_FAULTS:
        if inj.name == "sm_clock_drop" and inj.param("pct", 8.0) < MIN_STRAGGLER_DROP_PCT:
            return "nothing"
        if job_gpus < MIN_PEER_GROUP or overlap_ms <= 0:
            return "nothing"
        return "drain" if overlap_ms >= DRAIN_AFTER_MS else "straggler"
    return "nothing"


def build_labels(scenario: Scenario, schedule: Schedule) -> list[dict[str, Any]]:
    """One label per fault and confounder of ``scenario``, in scenario order (faults first)."""
    fleet = scenario.fleet
    horizon_ms = fleet.duration_ms
    out: list[dict[str, Any]] = []
    for inj in scenario.injections:
        start = round(inj.start_s * 1000)
        end = min(round(inj.end_s * 1000), horizon_ms) if inj.end_s is not None else horizon_ms
        run = None
        if "job_id" in inj.params:
            wanted = str(inj.params["job_id"])
            run = next(
                (r for r in schedule.runs if r.job.job_id == wanted and r.covers(start)), None
            )
        elif inj.node is not None:
            # A requeue ends the run at its onset, so look just before it.
            at = max(0, start - 1) if inj.name == "requeue" else start
            run = schedule.owner_at(inj.node, inj.gpu_index, at)
        overlap = 0
        if run is not None:
            run_end = run.end_ms if run.end_ms is not None else horizon_ms
            overlap = min(end, run_end) - max(start, run.start_ms)
        label: dict[str, Any] = {
            "kind": inj.kind,
            "name": inj.name,
            "node": fleet.node_name(inj.node) if inj.node is not None else None,
            "gpu_index": inj.gpu_index,
            "job_id": run.job.job_id if run is not None else None,
            "start_ms": fleet.start_ms + start,
            "end_ms": fleet.start_ms + end,
            "expect": _expect(inj, run.gpus if run else 0, overlap),
            "params": dict(inj.params),
        }
        if inj.name in NIC_FAULTS | NIC_CONFOUNDERS:
            _nic_label(label, inj, run, overlap, scenario)
        out.append(label)
    return out


def _nic_label(
    label: dict[str, Any], inj: Injection, run: JobRun | None, overlap: int, scenario: Scenario
) -> None:
    """The NIC fields of a label: ``port`` (faults on one port), the leaf's ``nodes`` (switch
    congestion) and the NIC ``expect``."""
    fleet = scenario.fleet
    if inj.kind == "fault":
        job_nodes = len(run.alloc) if run is not None else 0
        label["expect"] = _nic_expect(inj, job_nodes, overlap)
    if inj.name != "switch_congestion" and inj.kind == "fault":
        label["port"] = f"mlx5_{int(inj.params.get('port', 0))}/1"
    if inj.name == "switch_congestion" and inj.node is not None:
        leaf = leaf_nodes(inj.node, fleet.nodes_per_leaf, fleet.nodes)
        label["nodes"] = [fleet.node_name(n) for n in sorted(leaf)]
