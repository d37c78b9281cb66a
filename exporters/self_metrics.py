"""peerwatch's own metrics: which counters of each process are exported, under which names.

Pure (no SDK, no I/O): each process keeps its counters where they already are
(:class:`~peerwatch.streams.live.counters.StreamCounters`, the agent's ``AgentStats`` and
``DeliveryStats``, ...) and hands a snapshot mapping to
:class:`~peerwatch.exporters.self_telemetry.SelfTelemetry`, which reads it through these tables
at every export. Rates (records/s, windows/s) are taken by Prometheus from the counters
(``rate(peerwatch_stream_samples_total[1m])``), not computed here.

In Prometheus (through the collector's ``prometheus`` exporter) a counter ``a.b`` with unit
``s`` reads ``a_b_seconds_total``; a unit in braces is dropped (``{record}``); the process is
the ``job`` label (``service.name``: ``peerwatch-stream``, ``peerwatch-agent``, ...).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class SelfMetric:
    """One exported number: ``key`` in the process's snapshot mapping."""

    name: str
    unit: str
    kind: Literal["counter", "gauge"]
    key: str
    description: str


def _c(name: str, unit: str, key: str, description: str) -> SelfMetric:
    return SelfMetric(name, unit, "counter", key, description)


def _g(name: str, unit: str, key: str, description: str) -> SelfMetric:
    return SelfMetric(name, unit, "gauge", key, description)


#: The stream worker (``peerwatch stream``), from StreamCounters.
STREAM: tuple[SelfMetric, ...] = (
    _c("peerwatch.stream.samples", "{record}", "samples", "Node sample records aggregated."),
    _c("peerwatch.stream.gpu_readings", "{reading}", "gpu_samples",
       "GPU readings in the aggregated sample records."),
    _c("peerwatch.stream.batches", "{batch}", "batches", "Hot-path batches processed."),
    _c("peerwatch.stream.batch.time", "s", "batch_time_s",
       "Wall time spent in hot-path batches (rate / batches rate = mean batch latency)."),
    _g("peerwatch.stream.batch.duration", "s", "last_batch_s",
       "Wall time of the latest hot-path batch."),
    _c("peerwatch.stream.windows", "{window}", "windows", "GpuWindows closed and published."),
    _c("peerwatch.stream.findings", "{finding}", "findings", "StragglerFindings published."),
    _c("peerwatch.stream.recommendations", "{recommendation}", "recommendations",
       "DrainRecommendations published."),
    _c("peerwatch.stream.late", "{record}", "late",
       "Samples for windows already closed (dead-lettered with reason late)."),
    _c("peerwatch.stream.deadletter", "{record}", "deadletter",
       "Records sent to the dead-letter topic (any reason)."),
    _c("peerwatch.stream.unattributed", "{reading}", "unattributed",
       "GPU readings no job owned at their time."),
    _c("peerwatch.stream.step_times", "{record}", "step_times", "StepTime records taken."),
    _g("peerwatch.stream.consumer.lag", "{record}", "consumer_lag",
       "Samples not yet consumed on this worker's partitions (high watermark - position)."),
)  # fmt: skip

#: The node agent (``peerwatch agent``), from AgentStats, DeliveryStats and the spool.
AGENT: tuple[SelfMetric, ...] = (
    _c("peerwatch.agent.records", "{record}", "records", "Sample records produced."),
    _c("peerwatch.agent.ticks", "{tick}", "ticks", "Sampling ticks."),
    _c("peerwatch.agent.missed_ticks", "{tick}", "missed_ticks",
       "Ticks skipped because the loop fell behind."),
    _c("peerwatch.agent.encode_errors", "{record}", "encode_errors",
       "Records that could not be encoded."),
    _c("peerwatch.agent.xid_events", "{event}", "xid_events", "XID events seen."),
    _c("peerwatch.agent.cpu.time", "s", "cpu_s", "CPU time of the sampling loop."),
    _c("peerwatch.agent.delivery.delivered", "{record}", "delivered",
       "Records the broker acknowledged."),
    _c("peerwatch.agent.delivery.spooled", "{record}", "spooled",
       "Records written to the disk spool (broker unreachable)."),
    _c("peerwatch.agent.delivery.replayed", "{record}", "replayed",
       "Spooled records delivered later."),
    _c("peerwatch.agent.delivery.dropped", "{record}", "dropped",
       "Records given up (spool full or unrecoverable)."),
    _c("peerwatch.agent.delivery.failed_attempts", "{attempt}", "failed_attempts",
       "Failed delivery attempts."),
    _g("peerwatch.agent.spool.depth", "{record}", "spool_depth",
       "Records waiting in the disk spool."),
    # Not unit "1": the Prometheus translation would append "_ratio" to a state.
    _g("peerwatch.agent.breaker.open", "{state}", "breaker_open",
       "1 while the delivery breaker is open (spooling to disk), else 0."),
)  # fmt: skip

COMPONENTS: dict[str, tuple[SelfMetric, ...]] = {"stream": STREAM, "agent": AGENT}


def observations(specs: tuple[SelfMetric, ...], snapshot: Mapping[str, Any]) -> dict[str, float]:
    """``{metric name: value}`` for every spec whose key holds a finite number (bools are 0/1);
    missing, None or non-numeric values produce nothing (not a zero)."""
    out: dict[str, float] = {}
    for spec in specs:
        value = snapshot.get(spec.key)
        # bool is an int: True/False export as 1/0.
        if isinstance(value, int | float) and math.isfinite(value):
            out[spec.name] = float(value)
    return out
