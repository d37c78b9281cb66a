"""Labelled scenarios of the evaluation suites (``peerwatch eval --suite quick|full``).

Every scenario is a simulator document (see ``docs/scenarios.md``) built here from a few knobs,
so the suites cover every fault and confounder, several seeds and job sizes 1-512 GPUs:

- ``clock-<pct>``: an SM-clock drop of ``pct`` % on one GPU in each of five jobs of 8-128 GPUs
  (the 64- and 128-GPU ones last >= 10 min, so a DRAIN is expected); the drop-size sweep;
- ``onset-phase``: clock drops and throttling whose onsets fall at every phase of a window and
  between sampling ticks;
- ``throttle``: thermal throttling and power braking in jobs of 8, 16 and 64 GPUs;
- ``hard``: every hard XID, the application XIDs, an NVLink storm, a PCIe downtrain and a lost
  GPU, each in its own job (8 GPUs, and a 2-GPU job for the small-job case);
- ``confounders``: every confounder, with small jobs, a requeue, skewed and lossy nodes;
- ``big``: a 512-GPU job with a 6% drop and a throttle, plus a random 1-64 GPU workload;
- ``idle-hard``: hard conditions on idle GPUs and hard conditions present at agent start;
- ``silent``: agents going quiet (a node, a rack across jobs, a whole job, a node that never
  reported, an idle node);
- ``network`` (suite ``network`` only, so ``quick`` and ``full`` stay as they were): every NIC
  fault and confounder.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

QUICK_SEEDS = (1, 2, 3)
FULL_SEEDS = (1, 2, 3, 4, 5)
QUICK_PCTS = (4.0, 5.0, 6.0, 8.0, 10.0)
FULL_PCTS = (3.0, 4.0, 5.0, 5.5, 6.0, 7.0, 8.0, 10.0, 15.0)
HARD_XIDS = (48, 63, 64, 74, 79, 92, 94, 95)
APP_XIDS = (13, 31, 43, 45, 68)


@dataclass(frozen=True)
class EvalScenario:
    """One labelled scenario: a name and a simulator document."""

    name: str
    doc: dict[str, Any]


def _fleet(nodes: int, seed: int, duration_s: float, interval_s: float) -> dict[str, Any]:
    return {
        "nodes": nodes,
        "gpus_per_node": 8,
        "gpu_model": "H100" if seed % 2 else "H200",
        "interval_s": interval_s,
        "duration_s": duration_s,
        "seed": seed,
    }


def _onset(seed: int, i: int, base_s: float = 200.0) -> float:
    """Onsets spread over a window, so detection latency is measured at every phase."""
    return base_s + (seed * 11 + i * 7) % 30


def clock_sweep(pct: float, seed: int, duration_s: float = 1200.0) -> EvalScenario:
    sizes = (8, 16, 32, 64, 128)
    jobs, faults, first = [], [], 0
    for i, gpus in enumerate(sizes):
        job_id = f"{7000 + i}"
        jobs.append({"job_id": job_id, "gpus": gpus, "first_node": first, "duration_s": 7200})
        node = first + (seed + i) % (gpus // 8)
        start = _onset(seed, i)
        end = start + 400 if gpus < 64 else None  # the big jobs' drops last >= 10 min
        fault: dict[str, Any] = {
            "name": "sm_clock_drop",
            "node": node,
            "gpu_index": (seed * 3 + i) % 8,
            "start_s": start,
            "params": {"pct": pct},
        }
        if end is not None:
            fault["end_s"] = end
        faults.append(fault)
        first += gpus // 8
    doc = {"fleet": _fleet(first, seed, duration_s, 2.0), "jobs": jobs, "faults": faults}
    return EvalScenario(f"clock-{pct:g}pct-s{seed}", doc)


def onset_phase(seed: int, duration_s: float = 900.0) -> EvalScenario:
    """Faults whose onset falls anywhere inside a window and between two sampling ticks.

    Twelve 8-GPU jobs, one fault each (a 6% clock drop, thermal throttling or power braking in
    turn), with onsets 2.63 s apart plus a per-seed fraction: together they cover every phase of
    a 5-, 10- or 30-second window and every moment between ticks 2 s apart."""
    kinds: list[tuple[str, dict[str, Any]]] = [
        ("sm_clock_drop", {"pct": 6}),
        ("thermal_throttle", {"clock_drop_pct": 10}),
        ("power_brake", {}),
    ]
    jobs, faults = [], []
    for i in range(12):
        jobs.append({"job_id": f"{7500 + i}", "gpus": 8, "first_node": i, "duration_s": 7200})
        name, params = kinds[i % len(kinds)]
        start = round(200.0 + i * 2.63 + seed * 0.37, 2)
        faults.append(
            {
                "name": name,
                "node": i,
                "gpu_index": (seed + 5 * i) % 8,
                "start_s": start,
                "end_s": start + 240,
                "params": params,
            }
        )
    doc = {"fleet": _fleet(12, seed, duration_s, 2.0), "jobs": jobs, "faults": faults}
    return EvalScenario(f"onset-phase-s{seed}", doc)


def throttle(seed: int, duration_s: float = 1200.0) -> EvalScenario:
    sizes = (8, 16, 64)
    jobs, faults, first = [], [], 0
    for i, gpus in enumerate(sizes):
        job_id = f"{7100 + i}"
        jobs.append({"job_id": job_id, "gpus": gpus, "first_node": first, "duration_s": 7200})
        for k, name in enumerate(("thermal_throttle", "power_brake")):
            start = _onset(seed, 2 * i + k)
            # One short episode (straggler) and, in the 64-GPU job, long ones (drain).
            long = gpus == 64
            faults.append(
                {
                    "name": name,
                    "node": first + k % (gpus // 8),
                    "gpu_index": (seed + 2 * i + 3 * k) % 8,
                    "start_s": start,
                    "end_s": start + (800 if long else 300),
                    "params": {"clock_drop_pct": 10 + 5 * k} if name == "thermal_throttle" else {},
                }
            )
        first += gpus // 8
    doc = {"fleet": _fleet(first, seed, duration_s, 2.0), "jobs": jobs, "faults": faults}
    return EvalScenario(f"throttle-s{seed}", doc)


def hard_errors(seed: int, duration_s: float = 600.0) -> EvalScenario:
    kinds: list[tuple[str, dict[str, Any]]] = [("xid", {"xid": x}) for x in HARD_XIDS]
    kinds += [("xid", {"xid": x}) for x in APP_XIDS]
    kinds += [("nvlink_error_storm", {}), ("pcie_downtrain", {"width": 8}), ("gpu_lost", {})]
    jobs, faults = [], []
    for i, (name, params) in enumerate(kinds):
        jobs.append({"job_id": f"{7200 + i}", "gpus": 8, "first_node": i, "duration_s": 7200})
        faults.append(
            {
                "name": name,
                "node": i,
                "gpu_index": (seed + i) % 8,
                "start_s": _onset(seed, i, 150.0),
                "params": params,
            }
        )
    small = len(kinds)  # a 2-GPU job on its own node with an uncorrectable ECC error
    jobs.append({"job_id": "7299", "gpus": 2, "nodes": [small], "duration_s": 7200})
    faults.append(
        {"name": "xid", "node": small, "gpu_index": 1, "start_s": 250, "params": {"xid": 94}}
    )
    doc = {"fleet": _fleet(small + 1, seed, duration_s, 2.0), "jobs": jobs, "faults": faults}
    return EvalScenario(f"hard-s{seed}", doc)


def confounders(seed: int, duration_s: float = 1200.0) -> EvalScenario:
    jobs = [
        {"job_id": "7301", "gpus": 64, "first_node": 0, "duration_s": 7200,
         "checkpoint_every_s": 300, "checkpoint_s": 40},
        {"job_id": "7302", "gpus": 64, "first_node": 8, "duration_s": 7200},
        {"job_id": "7303", "gpus": 32, "first_node": 16, "duration_s": 7200,
         "eval_every_s": 400, "eval_s": 60},
        {"job_id": "7304", "gpus": 16, "first_node": 20, "duration_s": 7200},
    ]  # fmt: skip
    c = [
        {"name": "checkpoint", "node": 0, "start_s": 500, "end_s": 560},
        {"name": "eval_pause", "node": 16, "start_s": 700, "end_s": 760},
        {"name": "pipeline_stages", "node": 8, "start_s": 0},
        {"name": "network_slowdown", "node": 8, "start_s": 600, "end_s": 800},
        {"name": "dataloader_stall", "node": 1, "gpu_index": 2, "start_s": 300, "end_s": 900,
         "params": {"sm_factor": 0.4}},
        {"name": "cluster_power_cap", "start_s": 850, "end_s": 1050, "params": {"limit_w": 450}},
        {"name": "cluster_cooling", "start_s": 400, "end_s": 560, "params": {"clock_drop_pct": 6}},
        {"name": "small_jobs", "start_s": 60, "end_s": 600, "params": {"count": 8}},
        {"name": "requeue", "node": 20, "start_s": 400, "end_s": 460},
        {"name": "missing_samples", "node": 3, "start_s": 200, "end_s": 700,
         "params": {"drop_prob": 0.3, "mode": "lost"}},
        {"name": "missing_samples", "node": 17, "start_s": 200, "end_s": 700,
         "params": {"drop_prob": 0.5}},
        {"name": "clock_skew", "node": 5, "start_s": 0, "params": {"offset_ms": 1800}},
        {"name": "clock_skew", "node": 18, "start_s": 0, "params": {"offset_ms": -1500}},
    ]  # fmt: skip
    doc = {
        "fleet": _fleet(24, seed, duration_s, 1.0),
        "jobs": jobs,
        "confounders": c,
    }
    return EvalScenario(f"confounders-s{seed}", doc)


def big_job(seed: int, duration_s: float = 1200.0) -> EvalScenario:
    doc = {
        "fleet": _fleet(72, seed, duration_s, 5.0),
        "jobs": [{"job_id": "7400", "gpus": 512, "first_node": 0, "duration_s": 7200}],
        "workload": {"count": 12, "sizes": [1, 2, 4, 8, 16, 32, 64],
                     "size_weights": [3, 2, 2, 2, 1, 1, 1], "duration_s": [300, 900]},
        "faults": [
            {"name": "sm_clock_drop", "node": 10 + seed, "gpu_index": seed % 8,
             "start_s": _onset(seed, 0), "params": {"pct": 6}},
            {"name": "thermal_throttle", "node": 40 + seed, "gpu_index": (seed + 3) % 8,
             "start_s": _onset(seed, 1, 250.0), "end_s": _onset(seed, 1, 250.0) + 300},
        ],
        "confounders": [{"name": "checkpoint", "node": 0, "start_s": 700, "end_s": 760}],
    }  # fmt: skip
    return EvalScenario(f"big512-s{seed}", doc)


# -- hard faults on arrival, idle GPUs, silent agents (issue 13, items 1, 4, 5 and 7) -----------
def idle_hard(seed: int, duration_s: float = 600.0) -> EvalScenario:
    """Hard conditions on idle GPUs (a lost GPU, a PCIe downtrain, a remap pending: each on an
    idle node, mid-run) and hard conditions already present when the agents start (a lost GPU
    and a failed remap on idle nodes, a PCIe downtrain on a busy GPU). Every one expects a
    drain from the sample that shows it."""
    jobs = [
        {"job_id": "7500", "gpus": 32, "first_node": 0, "duration_s": 7200},
        {"job_id": "7501", "gpus": 16, "first_node": 4, "duration_s": 7200},
    ]  # nodes 6-11 stay idle
    g = seed % 8
    faults = [
        {"name": "gpu_lost", "node": 6, "gpu_index": g, "start_s": _onset(seed, 0, 150.0)},
        {"name": "pcie_downtrain", "node": 7, "gpu_index": (g + 1) % 8,
         "start_s": _onset(seed, 1, 150.0), "params": {"width": 8}},
        {"name": "xid", "node": 8, "gpu_index": (g + 2) % 8, "start_s": _onset(seed, 2, 150.0),
         "params": {"xid": 63}},
        # present at agent start
        {"name": "gpu_lost", "node": 9, "gpu_index": (g + 3) % 8, "start_s": 0},
        {"name": "xid", "node": 10, "gpu_index": (g + 4) % 8, "start_s": 0, "params": {"xid": 64}},
        {"name": "pcie_downtrain", "node": 1, "gpu_index": (g + 5) % 8, "start_s": 0,
         "params": {"width": 4}},
    ]  # fmt: skip
    doc = {"fleet": _fleet(12, seed, duration_s, 2.0), "jobs": jobs, "faults": faults}
    return EvalScenario(f"idle-hard-s{seed}", doc)


def silent_agents(seed: int, duration_s: float = 900.0) -> EvalScenario:
    """Agents that go quiet while their GPUs are allocated: one node of a job (2 minutes), a
    rack of 8 nodes across two jobs at once (one FLEET_WIDE finding expected), a 2-node job's
    both nodes (one job-level finding), a node that never reports from its job's start, and an
    idle node (nothing expected)."""
    jobs = [
        {"job_id": "7600", "gpus": 64, "first_node": 0, "duration_s": 7200},
        {"job_id": "7601", "gpus": 64, "first_node": 8, "duration_s": 7200},
        {"job_id": "7602", "gpus": 64, "first_node": 16, "duration_s": 7200},
        {"job_id": "7603", "gpus": 8, "first_node": 24, "duration_s": 7200},
        {"job_id": "7604", "gpus": 16, "first_node": 25, "duration_s": 7200},
    ]  # nodes 27-31 stay idle
    one = _onset(seed, 0)
    rack = 450.0 + seed % 7
    faults: list[dict[str, Any]] = [
        {"name": "agent_silent", "node": seed % 8, "start_s": one, "end_s": one + 120},
        {"name": "agent_silent", "node": 24, "start_s": 0, "end_s": 240},
        {"name": "agent_silent", "node": 29, "start_s": 300, "end_s": 400},
    ]
    faults += [
        {"name": "agent_silent", "node": n, "start_s": rack, "end_s": rack + 110}
        for n in range(12, 20)
    ]
    faults += [{"name": "agent_silent", "node": n, "start_s": 650, "end_s": 750} for n in (25, 26)]
    doc = {"fleet": _fleet(32, seed, duration_s, 2.0), "jobs": jobs, "faults": faults}
    return EvalScenario(f"silent-s{seed}", doc)


def hardfast_scenarios(seed: int) -> list[EvalScenario]:
    """This block's scenarios for one seed."""
    return [idle_hard(seed), silent_agents(seed)]


# -- end of the hard-faults / silence block ------------------------------------------------------
def network(seed: int, duration_s: float = 900.0) -> EvalScenario:
    """Every NIC fault and confounder (producers/sim/nic.py) on 24 nodes of 8 ports, 4 nodes a
    leaf switch: ports down for 3 s and 30 s, a flapping port and a symbol-error burst (drains),
    a link trained at half rate and one node's NIC retransmitting (NETWORK findings naming node
    and port), congestion under the leaf of half a job (one finding naming the switch), and the
    confounders (an all-to-all phase, checkpoint traffic, a counter reset, a reboot)."""
    fleet = {**_fleet(24, seed, duration_s, 1.0), "nics_per_node": 8, "nodes_per_leaf": 4}
    jobs = [
        {"job_id": "7501", "gpus": 64, "first_node": 0, "duration_s": 7200},
        {"job_id": "7502", "gpus": 64, "first_node": 8, "duration_s": 7200},
        {"job_id": "7503", "gpus": 32, "first_node": 16, "duration_s": 7200},
        {"job_id": "7504", "gpus": 32, "first_node": 20, "duration_s": 7200},
    ]
    faults = [
        {"name": "nic_port_down", "node": 1, "start_s": _onset(seed, 0), "end_s": _onset(seed, 0) + 3,
         "params": {"port": 2}},
        {"name": "nic_port_down", "node": 2, "start_s": 500, "end_s": 530, "params": {"port": 5}},
        {"name": "nic_port_flap", "node": 9, "start_s": 300, "end_s": 420,
         "params": {"port": 1, "flap_every_s": 30, "flap_down_s": 2}},
        {"name": "nic_symbol_errors", "node": 10, "start_s": 600, "end_s": 700,
         "params": {"port": 4, "errors_per_s": 200}},
        {"name": "nic_half_rate", "node": 17, "start_s": 250, "end_s": 650, "params": {"port": 6}},
        {"name": "nic_retransmit", "node": 21, "start_s": _onset(seed, 1, 300), "end_s": 700,
         "params": {"port": 3}},
        {"name": "switch_congestion", "node": 4, "start_s": 700, "end_s": 820},
    ]  # fmt: skip
    confounders = [
        {"name": "alltoall_phase", "node": 16, "start_s": 100, "end_s": 160},
        {"name": "checkpoint_traffic", "node": 20, "start_s": 150, "end_s": 200},
        {"name": "nic_counter_reset", "node": 13, "start_s": 400},
        {"name": "node_reboot", "node": 22, "start_s": 120, "params": {"down_s": 30}},
    ]
    doc = {"fleet": fleet, "jobs": jobs, "faults": faults, "confounders": confounders}
    return EvalScenario(f"network-s{seed}", doc)


def suite(name: str) -> list[EvalScenario]:
    """The scenarios of suite ``quick``, ``full`` or ``network`` (the NIC faults: ``peerwatch
    eval --suite network``); raises ValueError for another name."""
    if name == "network":
        return [network(seed) for seed in QUICK_SEEDS]
    seeds: tuple[int, ...]
    pcts: tuple[float, ...]
    if name == "quick":
        seeds, pcts, long_s = QUICK_SEEDS, QUICK_PCTS, 1200.0
    elif name == "full":
        seeds, pcts, long_s = FULL_SEEDS, FULL_PCTS, 1800.0
    else:
        raise ValueError(f"unknown suite {name!r} (quick, full or network)")
    out: list[EvalScenario] = []
    for seed in seeds:
        out += [clock_sweep(p, seed, long_s) for p in pcts]
        out += [throttle(seed, long_s), hard_errors(seed), confounders(seed, long_s)]
        out += hardfast_scenarios(seed)
        out.append(onset_phase(seed))
    out += [big_job(seed) for seed in (seeds[:1] if name == "quick" else seeds)]
    return out
