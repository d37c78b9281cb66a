"""Closed windows of the window aggregator for tests: a simulated fleet's (real values, a
clock drop, an XID) and hand-made ones of given GPUs."""

from __future__ import annotations

from typing import Any

import numpy as np

from peerwatch.producers.sim import Fleet
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.windows import _INT_ACCS, _INT_FILL, ClosedWindows, WindowAggregator

SCENARIO: dict[str, Any] = {
    "fleet": {"nodes": 2, "gpus_per_node": 8, "interval_s": 1, "duration_s": 120, "seed": 5,
              "step_times": True},
    "jobs": [{"job_id": "a", "gpus": 16, "first_node": 0, "warmup_s": 0}],
    "faults": [
        {"name": "sm_clock_drop", "node": 0, "gpu_index": 1, "start_s": 30, "params": {"pct": 10}},
        {"name": "xid", "node": 1, "gpu_index": 0, "start_s": 60, "params": {"xid": 79}},
    ],
}  # fmt: skip


def closed_windows() -> list[ClosedWindows]:
    """The simulated fleet's closed windows (a job, idle GPUs, a clock drop, an XID)."""
    table = AllocationTable()
    agg = WindowAggregator(table, 5, 1, idle_jobs=True)
    out: list[ClosedWindows] = []
    for tick in Fleet(parse_scenario(SCENARIO)).ticks():
        for r in tick:
            if r.stream == "job-events":
                table.apply_event(r.value)
            elif r.stream == "samples":
                agg.add_batch([r.value])
        if agg.watermark_ms is not None:
            out += agg.pop_ready(agg.watermark_ms)
    return out + agg.pop_all()


def closed_of(
    job: str, gpus: list[tuple[str, int]], end_ms: int, start_ms: int = 0, clk: float = 0.9
) -> ClosedWindows:
    """One window of ``job`` on ``gpus`` ((node, index) each) as the aggregator closes it: six
    readings each, SM clock at ``clk`` of its maximum, busy, no error."""
    n = len(gpus)
    names = list(dict.fromkeys(node for node, _ in gpus))
    node = np.array([names.index(nd) for nd, _ in gpus], np.int64)
    uuid = np.arange(len(names), len(names) + n)
    names += [f"GPU-{nd}-{i}" for nd, i in gpus]
    accs = dict(zip(_INT_ACCS, np.tile(_INT_FILL, (n, 1)).T.copy(), strict=True))
    for k in ("n", "clk_n", "sm_n", "pw_n", "pr_n", "bits_n"):
        accs[k][:] = 6
    accs["temp"][:], accs["wmin"][:], accs["wmax"][:] = 60, 16, 16
    floats = {"clk_s": 6 * clk, "sm_s": 6 * 90.0, "pw_s": 6 * 500_000.0, "pr_s": 6 * 0.8}
    accs.update({k: np.full(n, v) for k, v in floats.items()})
    accs.update(gid=np.arange(n), job=np.zeros(n, np.int64), uuid=uuid)
    index = np.array([i for _, i in gpus], np.int64)
    return ClosedWindows(start_ms, end_ms, accs, node, index, names, {0: (job, None, None, None)},
                         {})  # fmt: skip
