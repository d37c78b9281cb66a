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
    """One exported number: ``key`` in the process's snapshot mapping. With a ``label``, the key
    holds a mapping ``{label value: number}`` and each entry is one series carrying the label
    as an attribute (a gauge per node); ``scale`` converts the snapshot's unit (ms) to the
    metric's (s)."""

    name: str
    unit: str
    kind: Literal["counter", "gauge"]
    key: str
    description: str
    label: str = ""
    scale: float = 1.0


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
    _c("peerwatch.stream.pending_damaged", "{entry}", "pending_damaged",
       "Stage 3's pending-table entries found damaged: dropped (their windows are lost)."),
    _c("peerwatch.stream.state_damaged", "{entry}", "state_damaged",
       "Stage 3's and 4's saved job and node states found damaged: dropped, started afresh."),
    _g("peerwatch.stream.recovery.stalled", "s", "recovery_stalled_s",
       "How long faust's table recovery has read no changelog record (0: not recovering)."),
    _g("peerwatch.stream.consumer.lag", "{record}", "consumer_lag",
       "Samples not yet consumed on this worker's partitions (high watermark - position)."),
    _g("peerwatch.stream.clock_skewed_nodes", "{node}", "clock_skewed_nodes",
       "Nodes whose clock runs at least stream.clock_skew_warn_s from the fleet's."),
    SelfMetric("peerwatch.node.clock_offset", "s", "gauge", "clock_offsets_ms",
               "A node's sample clock less the fleet's median clock, from sample times "
               "against receive times (positive: ahead); per node of this worker's partitions.",
               label="node", scale=0.001),
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
    _c("peerwatch.agent.nic.records", "{record}", "nic_records",
       "NodeNicSample records produced (the NIC ports, one a tick)."),
    _c("peerwatch.agent.nic.errors", "{record}", "nic_errors",
       "NIC records that could not be sampled or encoded (dropped; the GPU records go on)."),
    _c("peerwatch.agent.nic.read_errors", "{value}", "nic_read_errors",
       "NIC sysfs values that could not be read or parsed (null in the record)."),
    _c("peerwatch.agent.nic.cpu.time", "s", "nic_cpu_s",
       "CPU time of the NIC sampling (sysfs reads and encoding), apart from the GPU's."),
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

#: The archiver (``peerwatch archive``), from ArchiveStats.
ARCHIVER: tuple[SelfMetric, ...] = (
    _c("peerwatch.archiver.records", "{record}", "records", "Records written to the archive."),
    _c("peerwatch.archiver.undecodable", "{record}", "undecodable",
       "Undecodable records (dead-lettered, skipped)."),
    _c("peerwatch.archiver.commits", "{commit}", "commits",
       "Durable commits (files and state fsynced, then Kafka offsets)."),
    _c("peerwatch.archiver.commit.time", "s", "commit_time_s",
       "Wall time spent in commits (rate / commits rate = mean commit latency)."),
    _c("peerwatch.archiver.consume_errors", "{error}", "consume_errors", "Consumer errors."),
)  # fmt: skip

#: The drain controller (``peerwatch drain-controller run``), from DrainStats.
DRAIN: tuple[SelfMetric, ...] = (
    _c("peerwatch.drain.recommendations", "{recommendation}", "recommendations",
       "Recommendations decided."),
    _c("peerwatch.drain.drained", "{decision}", "drained", "Nodes drained (enforce mode)."),
    _c("peerwatch.drain.shadowed", "{decision}", "shadowed", "Drains decided in shadow mode."),
    _c("peerwatch.drain.refused", "{decision}", "refused", "Drains refused (rate limits, "
       "breaker, cooldown, ...)."),
    _c("peerwatch.drain.duplicate", "{decision}", "duplicate", "Recommendations already decided."),
    _c("peerwatch.drain.resumed", "{decision}", "resumed", "Nodes resumed after expiry."),
    _c("peerwatch.drain.deadletter", "{record}", "deadletter", "Undecodable recommendations."),
    _c("peerwatch.drain.node_events", "{event}", "node_events", "Node state events read."),
    _c("peerwatch.drain.audit_failures", "{failure}", "audit_failures",
       "Failed deliveries of the audit (DrainAction) records, retried."),
    _c("peerwatch.drain.decision.time", "s", "decision_time_s",
       "Wall time spent deciding (Slurm's node list, the policy, scontrol)."),
    _g("peerwatch.drain.outbox.depth", "{record}", "outbox_depth",
       "Audit records decided but not yet delivered."),
    _g("peerwatch.drain.nodes.drained", "{node}", "drained_nodes",
       "Nodes currently drained by peerwatch (in the active mode's ledger)."),
    _g("peerwatch.drain.breaker.open", "{state}", "breaker_open",
       "1 while the drain circuit breaker is open, else 0."),
)  # fmt: skip

COMPONENTS: dict[str, tuple[SelfMetric, ...]] = {
    "stream": STREAM, "agent": AGENT, "archiver": ARCHIVER, "drain-controller": DRAIN,
}  # fmt: skip


def observations(specs: tuple[SelfMetric, ...], snapshot: Mapping[str, Any]) -> dict[str, float]:
    """``{metric name: value}`` for every spec whose key holds a finite number (bools are 0/1);
    missing, None or non-numeric values produce nothing (not a zero)."""
    out: dict[str, float] = {}
    for spec in specs:
        if spec.label:
            continue
        value = snapshot.get(spec.key)
        # bool is an int: True/False export as 1/0.
        if isinstance(value, int | float) and math.isfinite(value):
            out[spec.name] = float(value)
    return out


def labelled_observations(
    specs: tuple[SelfMetric, ...], snapshot: Mapping[str, Any]
) -> dict[str, list[tuple[str, float]]]:
    """``{metric name: [(label value, value), ...]}`` for every labelled spec (scaled), sorted
    by label value; entries whose label is not a string or whose value is not a finite number
    are left out."""
    out: dict[str, list[tuple[str, float]]] = {}
    for spec in specs:
        if not spec.label:
            continue
        values = snapshot.get(spec.key)
        if not isinstance(values, Mapping):
            continue
        out[spec.name] = [
            (label, float(value) * spec.scale)
            for label, value in sorted(values.items(), key=lambda kv: str(kv[0]))
            if isinstance(label, str)
            and isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
        ]
    return out
