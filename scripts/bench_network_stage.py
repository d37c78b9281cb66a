"""CPU of the network beside stage 2 (:class:`~peerwatch.streams.core.network_stage.NetworkStage`)
per NIC port reading and per node-window, fed as :class:`~peerwatch.streams.core.sample_stage.
SampleStage` feeds it: each tick's NodeNicSamples through ``add_nic`` (the link rules and the
readings kept), and each window start, once the watermark (newest tick less the lateness) passes
its end, through ``closed`` (every job's ports summarised, the leaf-switch grouping).

The simulator's fleet (``fleet.nics_per_node`` 8, 1 s ticks, 64-node jobs over every node, the
simulator's leaf topology) gives the samples; the closed windows are the aggregator's columns
for one slot per GPU of every node. CPU time is ``time.process_time``, best of ``--rounds``.

Compare two checkouts by running it with ``PYTHONPATH`` set to each (absolute), alternately:

    PYTHONPATH=$PWD .venv/bin/python scripts/bench_network_stage.py [--nodes 1000] [--seconds 60]
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np


def fleet_records(nodes: int, seconds: int) -> tuple[list[list[dict[str, Any]]], list[Any], Any]:
    """(NodeNicSamples per tick, JobEvents, the fleet's topology)."""
    from peerwatch.producers.sim.fleet import Fleet
    from peerwatch.producers.sim.nic import topology_conf
    from peerwatch.producers.sim.scenario import parse_scenario
    from peerwatch.streams.core.topology import parse_topology

    jobs = [{"job_id": str(100 + i), "gpus": 8 * min(64, nodes - first), "first_node": first,
             "warmup_s": 0, "duration_s": 7200}
            for i, first in enumerate(range(0, nodes, 64))]  # fmt: skip
    doc = {
        "fleet": {"nodes": nodes, "gpus_per_node": 8, "interval_s": 1.0, "duration_s": seconds,
                  "seed": 3, "nics_per_node": 8},
        "jobs": jobs,
    }  # fmt: skip
    fleet = Fleet(parse_scenario(doc))
    ticks: list[list[dict[str, Any]]] = []
    events: list[Any] = []
    for _, recs in fleet.timed_ticks():
        ticks.append([r.value for r in recs if r.stream == "nic-samples"])
        events += [r.value for r in recs if r.stream == "job-events"]
    spec = fleet.spec
    topology = parse_topology(topology_conf(spec.nodes, spec.nodes_per_leaf, spec.node_name))
    return ticks, events, topology


def closed_window(start: int, end: int, names: list[str], owner: dict[str, str]) -> Any:
    """The aggregator's closed columns of one window start: one slot per GPU of each node."""
    from peerwatch.streams.core.windows import ClosedWindows

    job_ids = sorted(set(owner.values()))
    code = {j: i for i, j in enumerate(job_ids)}
    node = np.repeat(np.arange(len(names), dtype=np.int64), 8)
    job = np.repeat(np.array([code[owner[n]] for n in names], dtype=np.int64), 8)
    gpu = np.tile(np.arange(8, dtype=np.int64), len(names))
    jobs = {i: (j, "u", "p", "a") for j, i in code.items()}
    return ClosedWindows(start, end, {"job": job}, node, gpu, names, jobs, {})


def one_round(
    ticks: list[list[dict[str, Any]]], events: list[Any], topology: Any
) -> dict[str, Any]:
    from peerwatch.settings import Settings
    from peerwatch.streams.core.allocation import AllocationTable
    from peerwatch.streams.core.network_stage import NetworkStage, readings_ms

    settings = Settings()
    window_ms = settings.detector.window_ms
    lateness_ms = int(settings.stream.lateness_s * 1000)
    allocations = AllocationTable()
    for event in events:
        allocations.apply_event(event)
    stage = NetworkStage(allocations, settings.network, settings.detector,
                         readings_ms=readings_ms(settings), topology=topology)  # fmt: skip
    names = sorted({s["node"] for tick in ticks for s in tick})
    owner = {}
    for n in names:
        gpus = allocations.segment(n, int(ticks[0][0]["ts_ms"]))[0]
        owner[n] = min(gpus.values()) if gpus else "idle"
    add_s = closed_s = 0.0
    readings = node_windows = findings = job_ports = 0
    next_start: int | None = None
    for tick in ticks:
        if not tick:
            continue
        t = time.process_time()
        findings += len(stage.add_nic(tick))
        add_s += time.process_time() - t
        readings += sum(len(s["ports"]) for s in tick)
        newest = max(int(s["ts_ms"]) for s in tick)
        if next_start is None:
            next_start = min(int(s["ts_ms"]) for s in tick) // window_ms * window_ms
        while next_start + window_ms + lateness_ms <= newest:
            part = closed_window(next_start, next_start + window_ms, names, owner)
            t = time.process_time()
            ports, switch = stage.closed([part])
            closed_s += time.process_time() - t
            job_ports += len(ports)
            findings += len(switch)
            node_windows += len(names)
            next_start += window_ms
    return {"add_s": add_s, "closed_s": closed_s, "readings": readings,
            "node_windows": node_windows, "findings": findings, "job_ports": job_ports,
            "window_ms": window_ms}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    ticks, events, topology = fleet_records(args.nodes, args.seconds)
    best: dict[str, Any] | None = None
    for _ in range(args.rounds):
        r = one_round(ticks, events, topology)
        if best is None or r["add_s"] + r["closed_s"] < best["add_s"] + best["closed_s"]:
            best = r
    assert best is not None
    per_reading_us = best["add_s"] / max(best["readings"], 1) * 1e6
    per_nw_ms = best["closed_s"] / max(best["node_windows"], 1) * 1e3
    window_s = best["window_ms"] / 1000
    # 100,000 GPUs: 12,500 nodes x 8 ports, one reading a second each
    at_scale = 12_500 * 8 * window_s * per_reading_us / 1e6 + 12_500 * per_nw_ms / 1e3
    print(f"{args.nodes} nodes x 8 ports x {args.seconds} s: {best['readings']} port readings, "
          f"{best['node_windows']} node-windows ({window_s:g} s), {best['job_ports']} job "
          f"ports, {best['findings']} findings; CPU, best of {args.rounds}:")  # fmt: skip
    print(f"  add_nic: {per_reading_us:.2f} us per port reading")
    print(f"  closed:  {per_nw_ms:.3f} ms per node-window (8 ports)")
    print(f"  12,500 nodes x 8 ports: {at_scale:.2f} s CPU per {window_s:g} s window "
          f"(one worker; divide by the workers)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
