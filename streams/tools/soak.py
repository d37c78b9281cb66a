"""The soak suite (``peerwatch eval --suite soak``): hours of a healthy fleet, every confounder
several times, no fault at all, and what it costs on-call.

A tool that cries wolf is turned off, so the soak counts what a person would be paged or
messaged for, per 100 node-days of fleet time:

- ``drains``: every DRAIN recommendation (the soak has no fault: each is false; target 0);
- ``gpu_alerts``: ALERT recommendations that blame GPUs (they name GPUs, and their cause is not
  ``HOST``) and no fault label explains (target <= 1 per 100 node-days);
- ``host_alerts``: ALERTs whose cause is ``HOST`` (a data-loader stall is a real slow rank, an
  INFO for the job's owner, reported apart);
- ``group_alerts``: ALERTs about a whole job or the fleet (no GPU named), reported apart.

Scenario knobs follow what a 128-node x 8-GPU training partition sees in three hours: random
jobs of 1-512 GPUs with checkpoints, evaluation phases and requeues, two fleet-wide power caps,
two fleet-wide cooling events, two job-wide network slowdowns, three data-loader stalls, lossy
nodes, and two nodes whose clocks run 2.5-4 s off.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from peerwatch.streams.tools.eval_suites import EvalScenario

#: Seeds of the soak suite; each is its own fleet history.
SOAK_SEEDS = (1, 2)
SOAK_NODES = 128
SOAK_HOURS = 3.0
#: Targets of issue "Quiet when nothing is wrong".
MAX_GPU_ALERTS_PER_100_NODE_DAYS = 1.0
NODE_DAY_S = 86_400.0


def soak(seed: int, nodes: int = SOAK_NODES, hours: float = SOAK_HOURS) -> EvalScenario:
    """A healthy fleet of ``nodes`` x 8 GPUs for ``hours`` with every confounder, no fault.

    Three pinned jobs (64, 128 and 32 GPUs from node 0) carry the job-wide confounders; the rest
    of the fleet runs a seeded random workload. Confounder times scale with the run's length.
    """
    if nodes < 32:
        raise ValueError(f"a soak needs at least 32 nodes for its pinned jobs, got {nodes}")
    duration_s = hours * 3600.0

    def at(frac: float) -> float:
        return round(frac * duration_s, 1)

    jobs = [
        {"job_id": "9001", "gpus": 64, "first_node": 0, "duration_s": duration_s,
         "checkpoint_every_s": 1200, "checkpoint_s": 60, "eval_every_s": 2700, "eval_s": 120},
        {"job_id": "9002", "gpus": 128, "first_node": 8, "duration_s": duration_s,
         "checkpoint_every_s": 900, "checkpoint_s": 45},
        {"job_id": "9003", "gpus": 32, "first_node": 24, "duration_s": duration_s,
         "eval_every_s": 1800, "eval_s": 90},
    ]  # fmt: skip
    workload = {
        "count": max(8, nodes // 3),
        "initial_fill": 0.6,
        "duration_s": [900, 5400],
        "checkpoint_every_s": 900,
        "checkpoint_s": 45,
        "eval_every_s": 1800,
        "eval_s": 90,
        "requeue_prob": 0.15,
    }
    skew_a, skew_b = 2500 + (seed * 377) % 1500, -(2500 + (seed * 611) % 1500)
    confounders = [
        {"name": "cluster_power_cap", "start_s": at(0.20), "end_s": at(0.20) + 600,
         "params": {"limit_w": 450}},
        {"name": "cluster_power_cap", "start_s": at(0.65), "end_s": at(0.65) + 900,
         "params": {"limit_w": 500}},
        {"name": "cluster_cooling", "start_s": at(0.40), "end_s": at(0.40) + 600,
         "params": {"clock_drop_pct": 6}},
        {"name": "cluster_cooling", "start_s": at(0.88), "end_s": at(0.88) + 300,
         "params": {"clock_drop_pct": 8}},
        {"name": "network_slowdown", "node": 8, "start_s": at(0.30), "end_s": at(0.30) + 300},
        {"name": "network_slowdown", "node": 0, "start_s": at(0.80), "end_s": at(0.80) + 240},
        {"name": "dataloader_stall", "node": 2, "gpu_index": seed % 8, "start_s": at(0.10),
         "end_s": at(0.10) + 600, "params": {"sm_factor": 0.4}},
        {"name": "dataloader_stall", "node": 12, "gpu_index": (seed + 3) % 8,
         "start_s": at(0.45), "end_s": at(0.45) + 400, "params": {"sm_factor": 0.5}},
        {"name": "dataloader_stall", "node": 25, "gpu_index": (seed + 5) % 8,
         "start_s": at(0.70), "end_s": at(0.70) + 900, "params": {"sm_factor": 0.3}},
        {"name": "pipeline_stages", "node": 8, "start_s": 0},
        {"name": "small_jobs", "start_s": at(0.05), "end_s": at(0.95),
         "params": {"count": max(6, nodes // 8), "duration_s": 600}},
        {"name": "missing_samples", "node": 5, "start_s": at(0.15), "end_s": at(0.40),
         "params": {"drop_prob": 0.3, "mode": "lost"}},
        {"name": "missing_samples", "node": 30, "start_s": at(0.50), "end_s": at(0.75),
         "params": {"drop_prob": 0.5}},
        {"name": "clock_skew", "node": 4, "start_s": 0, "params": {"offset_ms": skew_a}},
        {"name": "clock_skew", "node": 20, "start_s": 0, "params": {"offset_ms": skew_b}},
    ]  # fmt: skip
    doc = {
        "fleet": {
            "nodes": nodes,
            "gpus_per_node": 8,
            "gpu_model": "H100" if seed % 2 else "H200",
            "interval_s": 1.0,
            "duration_s": duration_s,
            "seed": 1000 + seed,
        },
        "jobs": jobs,
        "workload": workload,
        "confounders": confounders,
    }
    return EvalScenario(f"soak-{nodes}n-{hours:g}h-s{seed}", doc)


def soak_suite() -> list[EvalScenario]:
    """The scenarios of ``--suite soak``."""
    return [soak(seed) for seed in SOAK_SEEDS]


@dataclass
class AlertCensus:
    """What on-call received, by kind, and the fleet time it covers (node-seconds)."""

    node_s: float = 0.0
    drains: int = 0
    gpu_alerts: int = 0
    host_alerts: int = 0
    group_alerts: int = 0
    explained_alerts: int = 0

    def add(self, other: AlertCensus) -> None:
        self.node_s += other.node_s
        self.drains += other.drains
        self.gpu_alerts += other.gpu_alerts
        self.host_alerts += other.host_alerts
        self.group_alerts += other.group_alerts
        self.explained_alerts += other.explained_alerts

    @property
    def node_days(self) -> float:
        return self.node_s / NODE_DAY_S

    def per_100_node_days(self, count: int) -> float | None:
        return 100.0 * count / self.node_days if self.node_s > 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "node_days": self.node_days,
            "drains": self.drains,
            "gpu_alerts": self.gpu_alerts,
            "gpu_alerts_per_100_node_days": self.per_100_node_days(self.gpu_alerts),
            "host_alerts": self.host_alerts,
            "host_alerts_per_100_node_days": self.per_100_node_days(self.host_alerts),
            "group_alerts": self.group_alerts,
            "group_alerts_per_100_node_days": self.per_100_node_days(self.group_alerts),
            "explained_alerts": self.explained_alerts,
        }


def alert_kind(rec: Mapping[str, Any]) -> str:
    """``drain``, ``group`` (no GPU named: a job or the fleet), ``host`` or ``gpu``."""
    if rec.get("action") == "DRAIN":
        return "drain"
    if not rec.get("gpu_indices") or str(rec.get("reason", "")).startswith("job-wide"):
        return "group"
    if rec.get("cause") == "HOST":
        return "host"
    return "gpu"


def census(
    recommendations: Iterable[Mapping[str, Any]],
    node_s: float,
    explained: Any = None,
) -> AlertCensus:
    """Count ``recommendations`` by :func:`alert_kind` over ``node_s`` node-seconds. A GPU alert
    for which ``explained(rec)`` is true (a fault label covers it) is a true alert, counted
    apart."""
    out = AlertCensus(node_s=float(node_s))
    for rec in recommendations:
        kind = alert_kind(rec)
        if kind == "drain":
            out.drains += 1
        elif kind == "group":
            out.group_alerts += 1
        elif kind == "host":
            out.host_alerts += 1
        elif explained is not None and explained(rec):
            out.explained_alerts += 1
        else:
            out.gpu_alerts += 1
    return out


def format_census(rows: Sequence[tuple[str, AlertCensus]], total: AlertCensus) -> str:
    """One line per scenario and the total: node-days and alerts per kind (and per 100 node-days)."""
    lines = [
        f"{'scenario':24} {'node-days':>9} {'drains':>6} {'gpu':>5} {'/100nd':>7} "
        f"{'host':>5} {'/100nd':>7} {'group':>5} {'/100nd':>7}"
    ]
    for name, c in [*rows, ("TOTAL", total)]:
        lines.append(
            f"{name:24} {c.node_days:>9.2f} {c.drains:>6} "
            f"{c.gpu_alerts:>5} {_rate(c, c.gpu_alerts):>7} "
            f"{c.host_alerts:>5} {_rate(c, c.host_alerts):>7} "
            f"{c.group_alerts:>5} {_rate(c, c.group_alerts):>7}"
        )
    return "\n".join(lines)


def _rate(c: AlertCensus, count: int) -> str:
    value = c.per_100_node_days(count)
    return "-" if value is None else f"{value:.2f}"
