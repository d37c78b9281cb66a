"""The evaluation harness: labelled simulated scenarios through the pipeline, scored.

Scoring is pure (:func:`score`: labels, findings and recommendations in, :class:`Score` out);
:func:`run_scenario` runs one scenario through :class:`~peerwatch.streams.core.pipeline.Pipeline`;
:func:`evaluate` runs a suite (see :mod:`peerwatch.streams.tools.eval_suites`) and checks the targets.

Definitions (times int ms; latencies from the label's onset ``start_ms``):

- a label with ``expect == "straggler"`` or a clock fault with ``expect == "drain"`` is
  *recalled* by a SUSPECT or CONFIRMED finding on its node and GPU whose window overlaps the
  label's time; onset->finding latency uses the finding's ``stream_ms`` (when a live stream would
  have published it: window end + lateness);
- a label with ``expect == "drain"`` is recalled by a DRAIN recommendation for its node at or
  after onset and before ``end_ms + slack``; for hard errors the recommendation's event time
  (``ts_ms``, the end of the window that fired) must be within one window (plus one sampling
  interval, as a fault between two ticks shows only in the next sample) of the onset;
- onset -> ``detected_ms``, per fault kind: the event time at which the detector had its
  evidence (a window's end; a hard rule's sample time), of the first SUSPECT, CONFIRMED or
  HARD_ERROR finding on the label's node and GPU that overlaps the label's time; onset ->
  CONFIRMED uses the first CONFIRMED finding's ``stream_ms``;
- precision: share of finding episodes (per job, node, GPU, status kind) explained by a fault
  label (any ``expect``) on that node (and GPU) in time; a false drain is a DRAIN that no fault
  label on its node explains.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from peerwatch.producers.sim import Fleet, parse_scenario
from peerwatch.producers.sim.nic import NIC_FAULTS, topology_conf
from peerwatch.settings import Settings
from peerwatch.streams.core.pipeline import FINDING, RECOMMENDATION, Pipeline
from peerwatch.streams.core.settings import StageSettings
from peerwatch.streams.core.topology import parse_topology
from peerwatch.streams.tools.eval_suites import EvalScenario
from peerwatch.streams.tools.soak import MAX_GPU_ALERTS_PER_100_NODE_DAYS, AlertCensus, census

CLOCK_FAULTS = frozenset({"sm_clock_drop", "thermal_throttle", "power_brake"})
RECALL_STATUSES = frozenset({"SUSPECT", "CONFIRMED"})
EPISODE_STATUSES = frozenset({"SUSPECT", "CONFIRMED", "HARD_ERROR"})
#: A recommendation or finding up to this long after a label ends is still explained by it.
DEFAULT_SLACK_MS = 5 * 60 * 1000


@dataclass
class Score:
    """Counts and latencies of one scenario (or of several, added together)."""

    straggler_labels: int = 0
    straggler_hits: int = 0
    drain_labels: int = 0
    drain_hits: int = 0
    hard_labels: int = 0
    hard_in_window: int = 0
    episodes: int = 0
    episodes_explained: int = 0
    drains: int = 0
    false_drains: int = 0
    false_alerts: int = 0
    finding_latency_ms: list[int] = field(default_factory=list)
    rec_latency_ms: list[int] = field(default_factory=list)
    confirm_latency_ms: list[int] = field(default_factory=list)
    #: fault kind -> onset -> detected_ms of the first finding, ms.
    detect_by_kind: dict[str, list[int]] = field(default_factory=dict)
    #: (label name, pct or None) -> [labels, recalled] for straggler-type labels.
    by_kind: dict[str, list[int]] = field(default_factory=dict)
    #: The same for NIC labels expecting a ``network`` or ``switch`` finding (issue 38).
    network_by_kind: dict[str, list[int]] = field(default_factory=dict)
    #: Every NIC fault label expecting something (a drain, a network or switch finding), per
    #: kind: [labels, recalled]; and onset -> detected_ms of each one's first finding, ms.
    nic_by_kind: dict[str, list[int]] = field(default_factory=dict)
    nic_latency_ms: list[int] = field(default_factory=list)
    missed: list[dict[str, Any]] = field(default_factory=list)
    false_drain_records: list[dict[str, Any]] = field(default_factory=list)
    #: Recommendations by what they cost on-call, per fleet time (see the soak suite).
    alerts: AlertCensus = field(default_factory=AlertCensus)
    #: Silent agents (``expect == "silent"``): labels, those found by a SILENT or FLEET_WIDE
    #: finding, such findings made and those a silent label explains, onset -> detected_ms.
    silent_labels: int = 0
    silent_hits: int = 0
    silent_findings: int = 0
    silent_findings_explained: int = 0
    silent_latency_ms: list[int] = field(default_factory=list)

    def add(self, other: Score) -> None:
        for name in (
            "straggler_labels", "straggler_hits", "drain_labels", "drain_hits", "hard_labels",
            "hard_in_window", "episodes", "episodes_explained", "drains", "false_drains",
            "false_alerts", "silent_labels", "silent_hits", "silent_findings",
            "silent_findings_explained",
        ):  # fmt: skip
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.finding_latency_ms += other.finding_latency_ms
        self.rec_latency_ms += other.rec_latency_ms
        self.silent_latency_ms += other.silent_latency_ms
        self.confirm_latency_ms += other.confirm_latency_ms
        self.nic_latency_ms += other.nic_latency_ms
        for k, values in other.detect_by_kind.items():
            self.detect_by_kind.setdefault(k, []).extend(values)
        for mine_by, theirs in ((self.by_kind, other.by_kind),
                                (self.network_by_kind, other.network_by_kind),
                                (self.nic_by_kind, other.nic_by_kind)):  # fmt: skip
            for k, (n, hit) in theirs.items():
                mine = mine_by.setdefault(k, [0, 0])
                mine[0] += n
                mine[1] += hit
        self.missed += other.missed
        self.false_drain_records += other.false_drain_records
        self.alerts.add(other.alerts)

    @property
    def recall(self) -> float | None:
        n = self.straggler_labels + self.drain_labels
        return (self.straggler_hits + self.drain_hits) / n if n else None

    @property
    def precision(self) -> float | None:
        return self.episodes_explained / self.episodes if self.episodes else None

    def to_dict(self) -> dict[str, Any]:
        nic = (
            {
                "nic_recall_by_kind": {
                    k: {"labels": v[0], "recalled": v[1]}
                    for k, v in sorted(self.nic_by_kind.items())
                },
                "onset_to_nic_finding_s": latency_summary(self.nic_latency_ms),
            }
            if self.nic_by_kind
            else {}
        )
        return {
            "recall": self.recall,
            "precision": self.precision,
            "straggler_labels": self.straggler_labels,
            "straggler_recalled": self.straggler_hits,
            "drain_labels": self.drain_labels,
            "drain_recalled": self.drain_hits,
            "hard_labels": self.hard_labels,
            "hard_within_one_window": self.hard_in_window,
            "finding_episodes": self.episodes,
            "drains": self.drains,
            "false_drains": self.false_drains,
            "false_alerts": self.false_alerts,
            "onset_to_finding_s": latency_summary(self.finding_latency_ms),
            "onset_to_recommendation_s": latency_summary(self.rec_latency_ms),
            "onset_to_confirmed_s": latency_summary(self.confirm_latency_ms),
            "onset_to_detected_s_by_kind": {
                k: detected_summary(v) for k, v in sorted(self.detect_by_kind.items())
            },
            "recall_by_kind": {
                k: {"labels": v[0], "recalled": v[1]} for k, v in sorted(self.by_kind.items())
            },
            "network_recall_by_kind": {
                k: {"labels": v[0], "recalled": v[1]}
                for k, v in sorted(self.network_by_kind.items())
            },
            "missed": self.missed,
            "false_drain_records": self.false_drain_records,
            "alerts": self.alerts.to_dict(),
            "silent_labels": self.silent_labels,
            "silent_recalled": self.silent_hits,
            "silent_findings": self.silent_findings,
            "silent_findings_explained": self.silent_findings_explained,
            "onset_to_silent_s": latency_summary(self.silent_latency_ms),
            **nic,
        }


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100) or None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return float(ordered[int(rank) - 1])


def latency_summary(values_ms: Sequence[int]) -> dict[str, float | None]:
    """Median and p95 in seconds, and the count."""
    return {
        "n": len(values_ms),
        "median": statistics.median(values_ms) / 1000 if values_ms else None,
        "p95": (percentile(values_ms, 95) or 0) / 1000 if values_ms else None,
    }


def detected_summary(values_ms: Sequence[int]) -> dict[str, float | None]:
    """Median, p95 and max in seconds, and the count."""
    return {**latency_summary(values_ms), "max": max(values_ms) / 1000 if values_ms else None}


def kind_of(label: Mapping[str, Any]) -> str:
    """Grouping key of a label for the per-kind recall table, e.g. ``sm_clock_drop 6%``."""
    pct = (label.get("params") or {}).get("pct")
    if label["name"] == "sm_clock_drop":
        return f"sm_clock_drop {float(pct if pct is not None else 8.0):g}%"
    xid = (label.get("params") or {}).get("xid")
    if label["name"] == "xid" and xid is not None:
        return f"xid {int(xid)}"
    return str(label["name"])


def _overlaps(a0: int, a1: int, b0: int, b1: int) -> bool:
    return a0 < b1 and b0 < a1


def score(
    labels: Sequence[Mapping[str, Any]],
    findings: Iterable[tuple[Mapping[str, Any], int]],
    recommendations: Iterable[tuple[Mapping[str, Any], int]],
    window_ms: int = 30_000,
    slack_ms: int = DEFAULT_SLACK_MS,
    interval_ms: int = 0,
    node_s: float = 0.0,
) -> Score:
    """Score one scenario. ``findings`` and ``recommendations`` are (record, stream_ms) pairs.
    ``node_s``: the fleet time the scenario covers (nodes x seconds), for the alert census.

    ``interval_ms`` (the sampling interval) is added to the one-window allowance of hard
    errors: a fault between two ticks can only show in the next sample.
    """
    findings = list(findings)
    recs = list(recommendations)
    out = Score()
    faults = [lb for lb in labels if lb["kind"] == "fault"]
    for lb in labels:
        expect, name = lb["expect"], lb["name"]
        start, end = int(lb["start_ms"]), int(lb["end_ms"])
        missed, detected_n = len(out.missed), len(out.detect_by_kind.get(kind_of(lb), ()))
        if expect == "straggler" or (expect == "drain" and name in CLOCK_FAULTS):
            out.straggler_labels += 1
            hits = [
                ms
                for f, ms in findings
                if f["status"] in RECALL_STATUSES
                and f.get("node") == lb["node"]
                and f.get("gpu_index") == lb["gpu_index"]
                and _overlaps(int(f["window_start_ms"]), int(f["window_end_ms"]), start, end)
            ]
            entry = out.by_kind.setdefault(kind_of(lb), [0, 0])
            entry[0] += 1
            if hits:
                out.straggler_hits += 1
                entry[1] += 1
                out.finding_latency_ms.append(max(0, min(hits) - start))
                confirmed = [
                    ms
                    for f, ms in findings
                    if f["status"] == "CONFIRMED"
                    and f.get("node") == lb["node"]
                    and f.get("gpu_index") == lb["gpu_index"]
                    and _overlaps(int(f["window_start_ms"]), int(f["window_end_ms"]), start, end)
                ]
                if confirmed:
                    out.confirm_latency_ms.append(max(0, min(confirmed) - start))
            else:
                out.missed.append({**lb, "missing": "finding"})
        if expect in ("network", "switch"):
            _score_network(lb, findings, start, end + slack_ms, out)
        if expect in ("straggler", "drain"):
            detected = [
                int(f.get("detected_ms") or f["window_end_ms"])
                for f, _ in findings
                if f["status"] in EPISODE_STATUSES
                and f.get("node") == lb["node"]
                and (lb["gpu_index"] is None or f.get("gpu_index") == lb["gpu_index"])
                and _overlaps(int(f["window_start_ms"]), int(f["window_end_ms"]), start, end)
            ]
            if detected:
                out.detect_by_kind.setdefault(kind_of(lb), []).append(max(0, min(detected) - start))
        if expect == "drain":
            out.drain_labels += 1
            drains = [
                (r, ms)
                for r, ms in recs
                if r["action"] == "DRAIN"
                and r["node"] == lb["node"]
                and start <= int(r["ts_ms"]) + window_ms
                and int(r["ts_ms"]) <= end + slack_ms
            ]
            if drains:
                out.drain_hits += 1
                out.rec_latency_ms.append(max(0, min(ms for _, ms in drains) - start))
            else:
                out.missed.append({**lb, "missing": "drain"})
            if name not in CLOCK_FAULTS:
                out.hard_labels += 1
                if any(int(r["ts_ms"]) - start <= window_ms + interval_ms for r, _ in drains):
                    out.hard_in_window += 1
        if lb["kind"] == "fault" and name in NIC_FAULTS and expect != "nothing":
            entry = out.nic_by_kind.setdefault(kind_of(lb), [0, 0])
            entry[0] += 1
            entry[1] += len(out.missed) == missed
            out.nic_latency_ms += out.detect_by_kind.get(kind_of(lb), [])[detected_n:][:1]
    score_silence(labels, [f for f, _ in findings], slack_ms, out)
    seen: set[tuple[Any, ...]] = set()
    for f, _ in findings:
        if f["status"] not in EPISODE_STATUSES:
            continue
        first = f.get("first_flagged_ms") or f["window_start_ms"]
        episode = (
            f["job_id"],
            f.get("node"),
            f.get("gpu_index"),
            f["status"] == "HARD_ERROR",
            first,
        )
        if episode in seen:
            continue
        seen.add(episode)
        out.episodes += 1
        if _explained(
            faults,
            f.get("node"),
            f.get("gpu_index"),
            int(f["window_start_ms"]),
            int(f["window_end_ms"]),
            slack_ms,
        ):
            out.episodes_explained += 1
    for r, _ in recs:
        # The evidence of a recommendation: the window up to and including its event time (a
        # hard rule on arrival is at the very sample that shows the fault, maybe its onset).
        ts = int(r["ts_ms"]) + 1
        if r["action"] == "DRAIN":
            out.drains += 1
            if not _explained(faults, r["node"], None, ts - window_ms, ts, slack_ms):
                out.false_drains += 1
                out.false_drain_records.append(dict(r))
        elif (
            r["action"] == "ALERT"
            and not r.get("reason", "").startswith("job-wide")
            and not _explained(faults, r["node"], None, ts - window_ms, ts, slack_ms)
        ):
            out.false_alerts += 1

    def explained(r: Mapping[str, Any]) -> bool:
        ts = int(r["ts_ms"])
        return _explained(faults, r["node"], None, ts - window_ms, ts, slack_ms)

    out.alerts = census((r for r, _ in recs), node_s, explained)
    return out


def _score_network(
    lb: Mapping[str, Any],
    findings: Sequence[tuple[Mapping[str, Any], int]],
    start: int,
    end: int,
    out: Score,
) -> None:
    """A NIC label expecting a ``network`` finding (the job's peer comparison or a link rule
    naming the label's node and port) or a ``switch`` finding (one naming a switch over the
    label's nodes), cause NETWORK, between its onset and ``end``: per kind in
    ``network_by_kind``,
    onset -> detected_ms in ``detect_by_kind``. Neither is a straggler or drain label (recall
    and precision above stay the GPU detector's)."""
    nodes = set(lb.get("nodes") or [lb.get("node")])
    hits = [
        int(f.get("detected_ms") or f["window_end_ms"])
        for f, _ in findings
        if f.get("cause") == "NETWORK"
        and (
            f.get("switch") is not None and f.get("node") is None
            if lb["expect"] == "switch"
            else f.get("node") in nodes and (lb.get("port") is None or f.get("port") == lb["port"])
        )
        and _overlaps(int(f["window_start_ms"]), int(f["window_end_ms"]), start, end)
    ]
    entry = out.network_by_kind.setdefault(kind_of(lb), [0, 0])
    entry[0] += 1
    if hits:
        entry[1] += 1
        out.detect_by_kind.setdefault(kind_of(lb), []).append(max(0, min(hits) - start))
    else:
        out.missed.append({**lb, "missing": "network finding"})


def _silence_covers(f: Mapping[str, Any], lb: Mapping[str, Any]) -> bool:
    """Whether a silence finding names the label's node: itself, its job (a job-level finding),
    or the fleet (a FLEET_WIDE one)."""
    if f.get("node") is not None:
        return bool(f["node"] == lb["node"])
    return bool(f["status"] == "FLEET_WIDE" or f["job_id"] == lb.get("job_id"))


def score_silence(
    labels: Sequence[Mapping[str, Any]],
    findings: Sequence[Mapping[str, Any]],
    slack_ms: int,
    out: Score,
) -> None:
    """Silent agents: a label expecting ``silent`` is found by a SILENT / FLEET_WIDE finding
    (cause NO_SAMPLES) covering its node (:func:`_silence_covers`) detected within its time
    (plus slack); every such finding is explained by a silent label it covers."""
    silent = [
        f
        for f in findings
        if f["status"] in ("SILENT", "FLEET_WIDE") and f.get("cause") == "NO_SAMPLES"
    ]
    wanted = [lb for lb in labels if lb["expect"] == "silent"]

    def detected(f: Mapping[str, Any]) -> int:
        return int(f.get("detected_ms") or f["window_end_ms"])

    def within(f: Mapping[str, Any], lb: Mapping[str, Any]) -> bool:
        return int(lb["start_ms"]) <= detected(f) <= int(lb["end_ms"]) + slack_ms

    for lb in wanted:
        out.silent_labels += 1
        hits = [detected(f) for f in silent if _silence_covers(f, lb) and within(f, lb)]
        if hits:
            out.silent_hits += 1
            out.silent_latency_ms.append(min(hits) - int(lb["start_ms"]))
        else:
            out.missed.append({**lb, "missing": "silent"})
    for f in silent:
        out.silent_findings += 1
        if any(_silence_covers(f, lb) and within(f, lb) for lb in wanted):
            out.silent_findings_explained += 1


def _explained(
    faults: Sequence[Mapping[str, Any]],
    node: Any,
    gpu: Any,
    start_ms: int,
    end_ms: int,
    slack_ms: int,
) -> bool:
    for lb in faults:
        if lb["node"] != node:
            continue
        if gpu is not None and lb["gpu_index"] is not None and lb["gpu_index"] != gpu:
            continue
        if _overlaps(start_ms, end_ms, int(lb["start_ms"]), int(lb["end_ms"]) + slack_ms):
            return True
    return False


@dataclass
class ScenarioResult:
    name: str
    gpus: int
    labels: int
    score: Score
    runtime_s: float
    counters: dict[str, int]


def scenario_pipeline(fleet: Fleet, settings: StageSettings) -> Pipeline:
    """The pipeline a simulated fleet runs through: the live settings, and the fleet's switch
    layout (its ``topology.conf``, parsed as a worker parses one)."""
    spec = fleet.spec
    layout = topology_conf(spec.nodes, spec.nodes_per_leaf, spec.node_name)
    return Pipeline(settings, topology=parse_topology(layout))


def run_scenario(scenario: EvalScenario, settings: StageSettings) -> ScenarioResult:
    """Simulate ``scenario``, run the pipeline over it and score the outputs."""
    t0 = time.perf_counter()
    fleet = Fleet(parse_scenario(scenario.doc))
    pipeline = scenario_pipeline(fleet, settings)
    findings: list[tuple[dict[str, Any], int]] = []
    recs: list[tuple[dict[str, Any], int]] = []
    records = (r for batch in fleet.ticks() for r in batch)
    for out in pipeline.run(records):
        if out.kind == FINDING:
            findings.append((out.value, out.stream_ms))
        elif out.kind == RECOMMENDATION:
            recs.append((out.value, out.stream_ms))
    labels = fleet.labels()
    spec = fleet.spec
    node_s = spec.nodes * spec.duration_ms / 1000.0
    result = score(
        labels,
        findings,
        recs,
        settings.detector.window_ms,
        interval_ms=fleet.interval_ms,
        node_s=node_s,
    )
    return ScenarioResult(
        scenario.name,
        spec.nodes * spec.gpus_per_node,
        len(labels),
        result,
        time.perf_counter() - t0,
        pipeline.counters(),
    )


@dataclass(frozen=True)
class Target:
    name: str
    value: float | None
    goal: str
    passed: bool


def targets(total: Score, window_s: int) -> list[Target]:
    """The suite's acceptance targets, checked on the summed score."""
    clock_n = sum(n for n, _ in total.by_kind.values())
    clock_hit = sum(hit for _, hit in total.by_kind.values())
    clock_recall = clock_hit / clock_n if clock_n else None
    hard = total.hard_in_window / total.hard_labels if total.hard_labels else None
    first = latency_summary(total.finding_latency_ms)
    med, p95 = first["median"], first["p95"]
    confirmed = latency_summary(total.confirm_latency_ms)["median"]
    precision = total.precision
    out = [
        Target(
            "recall, clock drops >= 5% / throttling, jobs >= 8 GPUs",
            clock_recall,
            ">= 0.99",
            clock_recall is not None and clock_recall >= 0.99,
        ),
        Target(
            f"hard errors recommended within one window ({window_s} s)",
            hard,
            "= 1.0",
            hard is not None and hard >= 1.0,
        ),
        Target("false drains", float(total.false_drains), "= 0", total.false_drains == 0),
        Target("precision of finding episodes", precision, ">= 0.97",
               precision is not None and precision >= 0.97),
        Target("median onset->finding (s)", med, "<= 15", med is not None and med <= 15.0),
        Target("p95 onset->finding (s)", p95, "<= 30", p95 is not None and p95 <= 30.0),
        Target("median onset->CONFIRMED (s)", confirmed, "<= 60",
               confirmed is not None and confirmed <= 60.0),
    ]  # fmt: skip
    if total.nic_by_kind:
        worst = min(hit / n for n, hit in total.nic_by_kind.values())
        nic_med = latency_summary(total.nic_latency_ms)["median"]
        out += [
            Target("NIC faults: recall of the worst fault kind (drain or NETWORK finding)",
                   worst, ">= 0.99", worst >= 0.99),
            Target("NIC faults: median onset->first finding (s)", nic_med, "<= 15",
                   nic_med is not None and nic_med <= 15.0),
        ]  # fmt: skip
    if total.network_by_kind:
        n = sum(v[0] for v in total.network_by_kind.values())
        named = sum(v[1] for v in total.network_by_kind.values()) / n
        out.append(
            Target("NIC faults named (cause NETWORK, node and port or switch)", named, ">= 0.99",
                   named >= 0.99)
        )  # fmt: skip
    if total.silent_labels or total.silent_findings:
        found = total.silent_hits / total.silent_labels if total.silent_labels else None
        right = total.silent_findings_explained == total.silent_findings
        out.append(
            Target(
                "silent agents found (SILENT/FLEET_WIDE), no unexplained silence finding",
                found,
                "= 1.0",
                found is not None and found >= 1.0 and right,
            )
        )
    return out


def soak_targets(total: AlertCensus) -> list[Target]:
    """The soak suite's targets on the summed alert census: no drain, and at most
    ``MAX_GPU_ALERTS_PER_100_NODE_DAYS`` GPU-blaming alerts (data-loader stalls apart)."""
    rate = total.per_100_node_days(total.gpu_alerts)
    return [
        Target("drains", float(total.drains), "= 0", total.drains == 0),
        Target(
            "GPU-blaming alerts per 100 node-days (data-loader stalls apart)",
            rate,
            f"<= {MAX_GPU_ALERTS_PER_100_NODE_DAYS:g}",
            rate is not None and rate <= MAX_GPU_ALERTS_PER_100_NODE_DAYS,
        ),
    ]


def parse_overrides(items: Sequence[str], base: Settings | None = None) -> Settings:
    """The settings tree ``base`` (default: the tree's defaults, as a live worker runs) with
    ``table.NAME=VALUE`` overrides (``detector``, ``policy``, ``stream``; ``pipeline`` is
    ``stream``). Values are JSON (numbers, true/false, lists), else strings. Raises ConfigError
    naming the setting."""
    import json

    from peerwatch.errors import ConfigError
    from peerwatch.settings import with_overrides

    tree: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not name or section not in _OVERRIDABLE:
            raise ConfigError(
                key or item, "expected detector.NAME=VALUE, policy.NAME=VALUE or stream.NAME=VALUE"
            )
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        tree[f"{_OVERRIDABLE[section]}.{name}"] = value
    return with_overrides(base or Settings(), tree)


#: Sections ``--set`` accepts -> their table in the settings tree.
_OVERRIDABLE = {
    "detector": "detector",
    "policy": "policy",
    "stream": "stream",
    "pipeline": "stream",
}


def evaluate(
    scenarios: Sequence[EvalScenario],
    settings: StageSettings,
    on_result: Callable[[ScenarioResult], None] | None = None,
) -> tuple[list[ScenarioResult], Score, list[Target]]:
    """Run every scenario; returns per-scenario results, the summed score and the targets.
    ``on_result`` is called after each scenario (a progress bar)."""
    results = []
    for scenario in scenarios:
        results.append(run_scenario(scenario, settings))
        if on_result is not None:
            on_result(results[-1])
    total = Score()
    for r in results:
        total.add(r.score)
    return results, total, targets(total, settings.detector.window_s)


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def format_report(
    results: Sequence[ScenarioResult],
    total: Score,
    checks: Sequence[Target],
    width: int = 100,
) -> str:
    """A plain-text report of ``width`` columns: per scenario (a rich table), recall by kind,
    overall, the targets."""
    from peerwatch.console import render, table, user_text

    grid = table("scenario", "GPUs", "labels", "recall", "prec", "drains", "false", "med s",
                 "p95 s", "run s", right=tuple(range(1, 10)))  # fmt: skip
    rows: list[ScenarioResult | None] = [*results, None]
    for r in rows:
        s = total if r is None else r.score
        lat = latency_summary(s.finding_latency_ms)
        run_s = sum(x.runtime_s for x in results) if r is None else r.runtime_s
        grid.add_row(
            user_text("TOTAL" if r is None else r.name, 60),
            "" if r is None else str(r.gpus), "" if r is None else str(r.labels),
            _fmt(s.recall), _fmt(s.precision), str(s.drains), str(s.false_drains),
            _fmt(lat["median"], 1), _fmt(lat["p95"], 1), f"{run_s:.1f}",
            style="bold" if r is None else None,
        )  # fmt: skip
    lines = [render([grid], width=width).rstrip("\n")]
    lines.append("")
    lines.append("recall by fault (labels expecting a straggler or a clock-fault drain):")
    for kind, (n, hit) in sorted(total.by_kind.items(), key=lambda kv: _kind_order(kv[0])):
        lines.append(f"  {kind:24} {hit:>4}/{n:<4} {hit / n:.3f}")
    if total.network_by_kind:
        lines.append("NIC faults expecting a network or switch finding:")
        for kind, (n, hit) in sorted(total.network_by_kind.items()):
            lines.append(f"  {kind:24} {hit:>4}/{n:<4} {hit / n:.3f}")
    lines.append("")
    lines.append(
        "onset -> detected_ms of the first finding, by fault (s; the event time the detector had"
        " its evidence):"
    )
    lines.append(f"  {'fault':24} {'n':>4} {'median':>7} {'p95':>7} {'max':>7}")
    for kind, values in sorted(total.detect_by_kind.items(), key=lambda kv: _kind_order(kv[0])):
        d = detected_summary(values)
        lines.append(
            f"  {kind:24} {len(values):>4} {_fmt(d['median'], 1):>7} {_fmt(d['p95'], 1):>7} "
            f"{_fmt(d['max'], 1):>7}"
        )
    conf = latency_summary(total.confirm_latency_ms)
    lines.append(
        f"onset->CONFIRMED (published) median {_fmt(conf['median'], 1)} s, p95 "
        f"{_fmt(conf['p95'], 1)} s (n {conf['n']})"
    )
    rec = latency_summary(total.rec_latency_ms)
    lines.append(
        f"drain recall {total.drain_hits}/{total.drain_labels}; onset->recommendation median "
        f"{_fmt(rec['median'], 1)} s, p95 {_fmt(rec['p95'], 1)} s; false alerts "
        f"{total.false_alerts}"
    )
    if total.silent_labels or total.silent_findings:
        sil = latency_summary(total.silent_latency_ms)
        lines.append(
            f"silent agents found {total.silent_hits}/{total.silent_labels} by "
            f"{total.silent_findings} findings ({total.silent_findings_explained} explained); "
            f"onset->SILENT median {_fmt(sil['median'], 1)} s, p95 {_fmt(sil['p95'], 1)} s"
        )
    lines.append("")
    for t in checks:
        lines.append(f"{'PASS' if t.passed else 'FAIL'}  {t.name}: {_fmt(t.value)} (goal {t.goal})")
    return "\n".join(lines)


def _kind_order(kind: str) -> tuple[str, float]:
    name, _, pct = kind.partition(" ")
    return (name, float(pct.rstrip("%")) if pct else 0.0)
