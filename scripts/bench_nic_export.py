"""CPU per NIC port reading of the OTLP exporter's per-port metrics (docs/sizing.md).

Usage: .venv/bin/python scripts/bench_nic_export.py [--nodes 125] [--ticks 30] [--span-s 10]

Simulated 8-port NodeNicSamples (1 s ticks) are folded by
:class:`~peerwatch.producers.nic.spans.PortSpans` alone and written to an
:class:`~peerwatch.exporters.otlp_sdk.OtlpSink` (spans, series store, no export); CPU time
(``time.process_time``), best of three, per port reading.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter

from peerwatch.exporters.otlp_sdk import OtlpSink
from peerwatch.producers.nic.spans import PortSpans
from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.settings import ExportSettings


def samples(nodes: int, ticks: int) -> list[dict[str, Any]]:
    doc = {
        "fleet": {"nodes": nodes, "gpus_per_node": 8, "interval_s": 1.0, "duration_s": ticks,
                  "seed": 3, "nics_per_node": 8},
        "jobs": [{"job_id": "1", "gpus": min(512, nodes * 8), "first_node": 0, "warmup_s": 0,
                  "duration_s": 7200}],
    }  # fmt: skip
    return [r.value for _, recs in Fleet(parse_scenario(doc)).timed_ticks() for r in recs
            if r.stream == "nic-samples"]  # fmt: skip


def best_us(records: list[dict[str, Any]], fold: Callable[[], Callable[[Any], Any]]) -> float:
    readings = sum(len(s["ports"]) for s in records)
    best = float("inf")
    for _ in range(3):
        add = fold()
        t = time.process_time()
        for s in records:
            add(s)
        best = min(best, time.process_time() - t)
    return best / readings * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=125)
    p.add_argument("--ticks", type=int, default=30)
    p.add_argument("--span-s", type=float, default=10.0)
    args = p.parse_args()
    records = samples(args.nodes, args.ticks)
    spans = best_us(records, lambda: PortSpans(span_s=args.span_s).add_sample)

    def sink() -> Callable[[Any], Any]:
        s = OtlpSink(ExportSettings(interval_s=args.span_s), metric_exporter=None,
                     log_exporter=InMemoryLogRecordExporter())  # type: ignore[no-untyped-call]  # fmt: skip
        return lambda sample: s.write("NodeNicSample", sample)

    full = best_us(records, sink)
    n = sum(len(s["ports"]) for s in records)
    print(f"{n} port readings ({args.nodes} nodes x 8 ports x {args.ticks} ticks), "
          f"{args.span_s:g} s spans, CPU per port reading, best of 3:")  # fmt: skip
    print(f"  PortSpans.add_sample: {spans:.1f} us")
    print(f"  OtlpSink.write(NodeNicSample): {full:.1f} us")


if __name__ == "__main__":
    main()
