"""The topic catalogue: every topic peerwatch reads or writes, declared once.

Partition counts matter beyond throughput: the stream app co-partitions the allocation table with
the samples, so every topic keyed by node has the same partition count as the hot topic. That
count caps the hot path's consumers (one worker per partition at most): it is the setting
``stream.node_partitions`` (default :data:`NODE_PARTITIONS`; docs/sizing.md says how many and how
to grow it), passed to :func:`catalogue`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS
NODE_PARTITIONS = 12


@dataclass(frozen=True)
class TopicSpec:
    """One topic: its name, what its key is, its value schema, and its configuration."""

    name: str
    key: str
    value_schema: str | None
    partitions: int
    cleanup_policy: str
    retention_ms: int
    doc: str

    def config(self) -> dict[str, str]:
        """Topic-level configuration to create the topic with."""
        return {"cleanup.policy": self.cleanup_policy, "retention.ms": str(self.retention_ms)}


SAMPLES = TopicSpec(
    "peerwatch.gpu.samples", "node", "NodeGpuSample", NODE_PARTITIONS, "delete", DAY_MS,
    "All GPUs of one node at one tick, plus XID events since the last tick (the hot topic).",
)  # fmt: skip
NIC_SAMPLES = TopicSpec(
    "peerwatch.nic.samples", "node", "NodeNicSample", NODE_PARTITIONS, "delete", DAY_MS,
    "The node's chosen NIC ports (InfiniBand, RoCE, Ethernet) at one tick: raw sysfs state and "
    "counters. Co-partitioned with the GPU samples so stage 2 can join them by node.",
)  # fmt: skip
JOB_EVENTS = TopicSpec(
    "peerwatch.slurm.job-events", "job_id", "JobEvent", 6, "delete", 14 * DAY_MS,
    "Job lifecycle with per-node GPU indices, from the prolog/epilog hooks and the watcher.",
)  # fmt: skip
NODE_EVENTS = TopicSpec(
    "peerwatch.slurm.node-events", "node", "NodeStateEvent", NODE_PARTITIONS, "delete", 30 * DAY_MS,
    "Node state changes (DRAIN/DOWN, reason, who, when).",
)  # fmt: skip
HEALTH = TopicSpec(
    "peerwatch.health.results", "node", "HealthCheckResult", NODE_PARTITIONS, "delete", 30 * DAY_MS,
    "Prolog, epilog and periodic health-check results (Nagios status).",
)  # fmt: skip
STEP_TIMES = TopicSpec(
    "peerwatch.training.step-times", "job_id", "StepTime", 6, "delete", DAY_MS,
    "Optional per-rank step durations published by training code.",
)  # fmt: skip
JOB_WINDOWS = TopicSpec(
    "peerwatch.gpu.job-windows", "job_id", "GpuWindow", NODE_PARTITIONS, "delete", 3 * DAY_MS,
    "Per job, per GPU, per window aggregates with the GPU's straggler score.",
)  # fmt: skip
STRAGGLERS = TopicSpec(
    "peerwatch.stragglers", "job_id", "StragglerFinding", 6, "delete", 30 * DAY_MS,
    "Straggler findings with evidence (robust z, peer median, persistence).",
)  # fmt: skip
RECOMMENDATIONS = TopicSpec(
    "peerwatch.drain.recommendations", "node", "DrainRecommendation", 6, "delete", 30 * DAY_MS,
    "Drain recommendations with evidence and a deterministic id; read by the drain controller.",
)  # fmt: skip
ACTIONS = TopicSpec(
    "peerwatch.drain.actions", "node", "DrainAction", 6, "delete", 365 * DAY_MS,
    "What the drain controller did or refused, and why (the audit trail).",
)  # fmt: skip
STREAM_SETTINGS = TopicSpec(
    "peerwatch.stream.settings", "app_id|started_ms", None, 1, "compact", 365 * DAY_MS,
    "The [stream], [detector] and [policy] settings each stream worker started with, JSON "
    "(replay uses the ones live for its range).",
)  # fmt: skip
DEADLETTER = TopicSpec(
    "peerwatch.deadletter", "original key", None, 3, "delete", 14 * DAY_MS,
    "Records a stage could not decode or process: original bytes, reason in headers.",
)  # fmt: skip

TOPICS: tuple[TopicSpec, ...] = (
    SAMPLES, NIC_SAMPLES, JOB_EVENTS, NODE_EVENTS, HEALTH, STEP_TIMES,
    JOB_WINDOWS, STRAGGLERS, RECOMMENDATIONS, ACTIONS, STREAM_SETTINGS, DEADLETTER,
)  # fmt: skip
BY_NAME: dict[str, TopicSpec] = {t.name: t for t in TOPICS}


def topic_for_schema(schema_name: str) -> TopicSpec:
    """The topic that carries records of ``schema_name``. Raises KeyError if none does."""
    for spec in TOPICS:
        if spec.value_schema == schema_name:
            return spec
    raise KeyError(schema_name)


#: The topics whose partition count is the samples topic's (``stream.node_partitions``).
FOLLOW_SAMPLES: frozenset[str] = frozenset(
    t.name for t in (SAMPLES, NODE_EVENTS, HEALTH, JOB_WINDOWS)
)


def catalogue(prefix: str = "", node_partitions: int = NODE_PARTITIONS) -> tuple[TopicSpec, ...]:
    """The catalogue with every name prefixed (``topic_prefix`` setting: test isolation, tenants)
    and the samples topic and those co-partitioned with it at ``node_partitions`` partitions
    (``stream.node_partitions``). Raises ValueError for fewer than one partition."""
    if node_partitions < 1:
        raise ValueError(f"node_partitions must be >= 1, got {node_partitions}")
    if not prefix and node_partitions == NODE_PARTITIONS:
        return TOPICS
    return tuple(
        replace(
            t,
            name=prefix + t.name,
            partitions=node_partitions if t.name in FOLLOW_SAMPLES else t.partitions,
        )
        for t in TOPICS
    )
