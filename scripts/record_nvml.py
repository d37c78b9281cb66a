"""Run the real agent loop on a GPU node and record what NVML answered, as a test fixture.

The agent's own sampler, XID watcher and loop (``NodeAgent``, one record per tick) run over the
real ``pynvml`` through :class:`~peerwatch.producers.nvml.trace.RecordingNvml`; no Kafka: each
record is kept as the dict the agent would encode. Optionally a GPU load (a bf16 matrix product
loop through PyTorch) runs in the middle, so clocks, power, utilisation and SM activity move.
Writes ``OUT/trace.json`` (every NVML call and answer, the binding's field ids, where and when)
and ``OUT/records.jsonl`` (the records, in order). With ``--health``, the node health checks
(prolog phase, ``run_health``) run after it through a recording of their own:
``OUT/health-trace.json`` and ``OUT/health-result.json``. Needs only ``pynvml``
(``nvidia-ml-py``) and, for the load, ``torch``.

PYTHONPATH=. python3 scripts/record_nvml.py --ticks 12 --load-after 3 --load-s 5 [--health] --out DIR
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pynvml

from peerwatch.clock import SYSTEM_CLOCK
from peerwatch.producers.agent import JsonLinesSink, NodeAgent
from peerwatch.producers.nvml.device import init_nvml
from peerwatch.producers.nvml.sampler import GpuSampler
from peerwatch.producers.nvml.trace import RecordingNvml
from peerwatch.producers.nvml.xid import XidWatcher

LOAD = """
import sys, time, torch
end = time.time() + float(sys.argv[1])
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
n = 0
while time.time() < end:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
    n += 20
print(f"load: {n} products of 8192^3 bf16", flush=True)
"""


def _binding_version() -> str | None:
    try:
        return importlib.metadata.version("nvidia-ml-py")
    except importlib.metadata.PackageNotFoundError:
        return None


def _raw(call: Any) -> Any:
    try:
        value = call()
    except pynvml.NVMLError as exc:
        return f"error: {exc}"
    return value.decode() if isinstance(value, bytes) else value


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ticks", type=int, default=12, help="regular ticks (records) to take")
    p.add_argument("--interval-s", type=float, default=1.0)
    p.add_argument("--load-after", type=float, default=3.0, help="seconds before the GPU load")
    p.add_argument("--load-s", type=float, default=5.0, help="seconds of GPU load (0: none)")
    p.add_argument("--node", default=platform.node() or "gpu-node")
    p.add_argument("--health", action="store_true", help="also record the prolog health checks")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    nvml = RecordingNvml(pynvml)
    init_nvml(nvml)
    interval_ms = int(args.interval_s * 1000)
    sampler = GpuSampler(nvml, args.node, interval_ms, SYSTEM_CLOCK, agent_run_id="recorded")
    load = None
    if args.load_s > 0:
        cmd = [sys.executable, "-c", f"import time; time.sleep({args.load_after})\n" + LOAD,
               str(args.load_s)]  # fmt: skip
        load = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    with (args.out / "records.jsonl").open("w") as records:
        agent = NodeAgent(
            sampler=sampler, sink=JsonLinesSink(json.loads, records),  # as --dry-run prints them
            encode=lambda r: json.dumps(r).encode(), topic="samples", node=args.node,
            interval_ms=interval_ms, clock=SYSTEM_CLOCK,
            watcher_factory=lambda cb: XidWatcher(nvml, cb, SYSTEM_CLOCK),
        )  # fmt: skip
        stats = agent.run(args.ticks)
    load_out = None
    if load is not None:
        load_out = load.communicate(timeout=args.load_after + args.load_s + 120)[0].strip()
    meta = {
        "node": args.node,
        "recorded_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "binding": f"nvidia-ml-py {_binding_version()}",
        "driver_version": _raw(pynvml.nvmlSystemGetDriverVersion),
        "nvml_version": _raw(pynvml.nvmlSystemGetNVMLVersion),
        "cuda_driver_version": _raw(pynvml.nvmlSystemGetCudaDriverVersion_v2),
        "python": platform.python_version(),
        "interval_ms": interval_ms,
        "load": {"after_s": args.load_after, "seconds": args.load_s, "output": load_out},
        "agent_stats": {
            "records": stats.records,
            "ticks": stats.ticks,
            "missed_ticks": stats.missed_ticks,
            "cpu_ms_per_record": round(stats.cpu_ms_per_record, 3),
            "cpu_ms_max": round(stats.cpu_ms_max, 3),
        },
    }
    nvml.nvmlShutdown()
    (args.out / "trace.json").write_text(json.dumps(nvml.trace(**meta), indent=1) + "\n")
    print(json.dumps(meta, indent=1))
    if args.health:
        record_health(args.node, meta, args.out)
    return 0


def record_health(node: str, meta: dict[str, Any], out: Path) -> None:
    """The prolog health checks over a recording of their own (module docstring)."""
    from peerwatch.producers.health.run import HealthDeps, HealthSettings, run_health

    nvml = RecordingNvml(pynvml)
    result, code = run_health("PROLOG", node=node, settings=HealthSettings(),
                              deps=HealthDeps(nvml=nvml))  # fmt: skip
    (out / "health-trace.json").write_text(json.dumps(nvml.trace(**meta), indent=1) + "\n")
    (out / "health-result.json").write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"health: exit code {code}", json.dumps(result["checks"], indent=1))


if __name__ == "__main__":
    sys.exit(main())
