"""What each NVML call the agent makes per tick costs on this node: wall and CPU time per call,
GPU by GPU, idle (run it beside a load to see it busy). Needs a GPU and ``pynvml``.

PYTHONPATH=. python3 scripts/bench_nvml_calls.py [--repeat 20] [--json]

The calls are those of one agent tick (``peerwatch.producers.nvml``: the tick reads, the field
values batch, GPM), each timed alone ``--repeat`` times; plus the alternatives the agent could
use instead (the energy counter through field values, field values one id at a time).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import pynvml

from peerwatch.producers.nvml.device import init_nvml
from peerwatch.producers.nvml.probe import GpuProbe, probe_gpus


def timed(call: Callable[[], Any], repeat: int) -> dict[str, Any]:
    """Median and max wall ms, median CPU ms (this thread) of ``repeat`` calls; the error of a
    failing call instead."""
    wall: list[float] = []
    cpu: list[float] = []
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.thread_time()
        try:
            call()
        except pynvml.NVMLError as exc:
            return {"error": str(exc)}
        cpu.append((time.thread_time() - c0) * 1000)
        wall.append((time.perf_counter() - w0) * 1000)
    return {
        "wall_ms_median": round(statistics.median(wall), 3),
        "wall_ms_max": round(max(wall), 3),
        "cpu_ms_median": round(statistics.median(cpu), 3),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    init_nvml(pynvml)  # type: ignore[arg-type]
    out = measure(pynvml, args.repeat)
    pynvml.nvmlShutdown()
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    for gpu, rows in out.items():
        print(gpu)
        for name, t in sorted(rows.items(), key=lambda kv: -kv[1].get("wall_ms_median", 0)):
            print(f"  {name:48s} {t}")
    return 0


def measure(nvml: Any, repeat: int) -> dict[str, Any]:
    """Per GPU, each call's :func:`timed` figures (``nvml`` initialised)."""
    return {
        f"gpu{probe.index} {probe.name}": {
            name: timed(call, repeat) for name, call in tick_calls(nvml, probe).items()
        }
        for probe in probe_gpus(nvml)
    }


def tick_calls(nvml: Any, probe: GpuProbe) -> dict[str, Callable[[], Any]]:
    """The NVML calls of one agent tick on one GPU, and the alternatives (module docstring)."""
    h = probe.handle
    calls: dict[str, Callable[[], Any]] = {
        name: functools.partial(read, nvml, h) for name, read in probe.reads.items()
    }
    values = nvml.nvmlDeviceGetFieldValues
    if probe.field_ids:
        calls["nvmlDeviceGetFieldValues(all)"] = functools.partial(values, h, probe.field_ids)
        for fid in probe.field_ids:
            calls[f"nvmlDeviceGetFieldValues([{fid}])"] = functools.partial(values, h, [fid])
    energy = getattr(nvml, "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", None)
    if energy is not None:
        calls["nvmlDeviceGetFieldValues([energy])"] = functools.partial(values, h, [energy])
        calls["nvmlDeviceGetFieldValues(all + energy)"] = functools.partial(
            values, h, [*probe.field_ids, energy]
        )
    gpm = probe.gpm
    if gpm is not None:
        calls["nvmlGpmSampleGet"] = functools.partial(nvml.nvmlGpmSampleGet, h, gpm.cur)

        def metrics() -> None:
            gpm.metrics.sample1, gpm.metrics.sample2 = gpm.prev, gpm.cur
            nvml.nvmlGpmMetricsGet(gpm.metrics)

        calls["nvmlGpmMetricsGet"] = metrics
    return calls


if __name__ == "__main__":
    sys.exit(main())
