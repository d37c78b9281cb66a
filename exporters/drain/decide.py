"""The drain policy: a pure function of a recommendation, the controller state, what Slurm says
about the nodes, the settings and the time. It changes nothing; ``apply_decision`` records a
decision in the state once the controller has carried it out.

Checks, in order (the first that fails decides): a usable recommendation id; not decided before
(DUPLICATE); a plain node name, job ids and evidence time (invalid_input); a DRAIN action (ALERT is
audited as ``alert_only``); the node exists in Slurm (unknown_node); not already drained by
peerwatch (DUPLICATE); the recommendation's ``expires_ms`` has not passed (expired); its evidence
(``ts_ms``) is younger than the freshness bound (stale); no reason set by someone else
(foreign_reason); breaker closed (breaker_open); the evidence is newer than an operator's resume of
the node, hard or not (evidence_before_resume); operator cooldown unless hard (operator_cooldown);
per-job rate (job_rate_limit); per-partition rate (partition_rate_limit); the drain would not take
peerwatch-drained nodes above the breaker share (breaker_open, and the breaker latches open in
enforce mode); nor above the cluster-wide cap, nodes in no partition included (cluster_cap).

The age checks come after the DUPLICATE of a node already carrying our reason, so a drain whose
state save was lost in a crash is still adopted (then auto-resumed once expired), never repeated.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from peerwatch import reasons
from peerwatch.exporters.drain.config import DrainSettings
from peerwatch.exporters.drain.sanitize import safe_label, valid_node_name
from peerwatch.exporters.drain.state import ControllerState, Decided, DrainedNode

JOB_ID = re.compile(r"[A-Za-z0-9_+.\[\]-]{1,64}")
RECOMMENDATION_ID = re.compile(r"[\x21-\x7e]{1,256}")
_HELD_STATES = frozenset({"DOWN", "ERROR", "FAIL", "FAILING", "DRAIN", "DRAINED", "DRAINING"})


class Outcome(StrEnum):
    DRAINED = "DRAINED"
    RESUMED = "RESUMED"
    REFUSED = "REFUSED"
    SHADOWED = "SHADOWED"
    DUPLICATE = "DUPLICATE"


class Refusal(StrEnum):
    JOB_RATE_LIMIT = "job_rate_limit"
    PARTITION_RATE_LIMIT = "partition_rate_limit"
    BREAKER_OPEN = "breaker_open"
    OPERATOR_COOLDOWN = "operator_cooldown"
    FOREIGN_REASON = "foreign_reason"
    UNKNOWN_NODE = "unknown_node"
    INVALID_INPUT = "invalid_input"
    SLURM_ERROR = "slurm_error"
    #: An ALERT recommendation: audited, never drains.
    ALERT_ONLY = "alert_only"
    #: The recommendation's ``expires_ms`` has passed.
    EXPIRED = "expired"
    #: The evidence (``ts_ms``) is older than ``drain.max_age_s`` (``hard_max_age_s`` if hard).
    STALE = "stale"
    #: An operator resumed the node after the evidence was taken (hard included).
    EVIDENCE_BEFORE_RESUME = "evidence_before_resume"
    #: The drain would take peerwatch-drained nodes of the whole cluster above the cap.
    CLUSTER_CAP = "cluster_cap"
    #: Not signed by a stream worker's key (exporters/drain/provenance.py): never decided.
    UNVERIFIED_SOURCE = "unverified_source"


@dataclass(frozen=True)
class NodeFacts:
    """What Slurm says about one node right now."""

    name: str
    state: str
    flags: tuple[str, ...] = ()
    reason: str | None = None
    reason_user: str | None = None
    partitions: tuple[str, ...] = ()

    @property
    def drained(self) -> bool:
        """DRAIN set (draining or drained) or the node is down: it takes no new jobs."""
        return bool(_HELD_STATES & {self.state.upper(), *(f.upper() for f in self.flags)})

    @property
    def ours(self) -> bool:
        """Held with a reason carrying the peerwatch prefix."""
        return self.drained and (self.reason or "").startswith(reasons.REASON_PREFIX)

    @property
    def foreign(self) -> bool:
        """Held or annotated by someone else: a reason not ours, or held without any reason."""
        reason = (self.reason or "").strip()
        if reason:
            return not reason.startswith(reasons.REASON_PREFIX)
        return self.drained


@dataclass(frozen=True)
class ClusterView:
    """The nodes Slurm knows, by name, and the partition sizes (settings override counts)."""

    nodes: Mapping[str, NodeFacts]
    size_overrides: Mapping[str, int] = field(default_factory=dict)
    #: The cluster's node count for the cluster-wide cap; 0 = the nodes Slurm lists.
    cluster_size_override: int = 0

    @classmethod
    def of(
        cls,
        nodes: Iterable[NodeFacts],
        size_overrides: Mapping[str, int] | None = None,
        cluster_size: int = 0,
    ) -> ClusterView:
        return cls({n.name: n for n in nodes}, dict(size_overrides or {}), cluster_size)

    @property
    def cluster_size(self) -> int:
        """Every node of the cluster, those Slurm lists in no partition included."""
        return self.cluster_size_override or len(self.nodes)

    def ours(self) -> set[str]:
        """Nodes Slurm shows held with a peerwatch reason, in any partition or none."""
        return {n.name for n in self.nodes.values() if n.ours}

    def partition_size(self, partition: str) -> int:
        if partition in self.size_overrides:
            return self.size_overrides[partition]
        return sum(1 for n in self.nodes.values() if partition in n.partitions)

    def ours_in(self, partition: str) -> set[str]:
        return {n.name for n in self.nodes.values() if n.ours and partition in n.partitions}


@dataclass(frozen=True)
class Decision:
    """The outcome for one recommendation and what to record. ``drain`` is True only when Slurm
    must be changed (enforce mode, outcome DRAINED); ``slurm_reason`` is the exact Reason= text."""

    outcome: Outcome
    node: str
    ts_ms: int
    enforce: bool
    detail: str
    recommendation_id: str | None = None
    refusal: Refusal | None = None
    slurm_reason: str | None = None
    partition: str | None = None
    partitions: tuple[str, ...] = ()
    job_ids: tuple[str, ...] = ()
    expires_ms: int | None = None
    #: Set when this decision latches the circuit breaker open (why).
    open_breaker: str | None = None
    #: DUPLICATE of a peerwatch drain missing from the ledger (lost before a crash): adopt it.
    adopt: bool = False

    @property
    def mode(self) -> str:
        return "ENFORCE" if self.enforce else "SHADOW"

    @property
    def records_drain(self) -> bool:
        """Whether the decision adds a (real or would-be) drain to the ledger."""
        return self.outcome in (Outcome.DRAINED, Outcome.SHADOWED) or self.adopt

    def failed(self, detail: str) -> Decision:
        """The same decision refused because Slurm failed (``slurm_error``)."""
        return Decision(
            Outcome.REFUSED, self.node, self.ts_ms, self.enforce, detail, self.recommendation_id,
            Refusal.SLURM_ERROR, self.slurm_reason, self.partition, self.partitions, self.job_ids,
        )  # fmt: skip


def _allowed(size: int, pct: float, floor: int) -> float:
    # A small epsilon keeps 2% of 50 nodes at exactly 1 despite float rounding.
    return max(math.floor(size * pct / 100 + 1e-9), floor)


def decide(
    rec: Mapping[str, Any],
    state: ControllerState,
    cluster: ClusterView,
    settings: DrainSettings,
    now_ms: int,
) -> Decision:
    """Decide what to do with one DrainRecommendation record (a dict as the codec decodes it).

    Pure: reads ``state`` and ``cluster``, changes nothing, raises nothing for any record shape.
    Times in int ms; windows and cooldowns come from ``settings`` in seconds.
    """
    enforce = settings.enforce
    raw_node = rec.get("node")
    label = safe_label(raw_node) if isinstance(raw_node, str) else "?"
    rec_id = rec.get("recommendation_id")

    def out(outcome: Outcome, detail: str, refusal: Refusal | None = None, **kw: Any) -> Decision:
        return Decision(outcome, label, now_ms, enforce, detail,
                        rec_id if isinstance(rec_id, str) and RECOMMENDATION_ID.fullmatch(rec_id) else None,
                        refusal, **kw)  # fmt: skip

    def refuse(refusal: Refusal, detail: str, **kw: Any) -> Decision:
        return out(Outcome.REFUSED, f"{refusal}: {detail}", refusal, **kw)

    if not isinstance(rec_id, str) or not RECOMMENDATION_ID.fullmatch(rec_id):
        shown = safe_label(rec_id) if isinstance(rec_id, str) else type(rec_id).__name__
        return refuse(
            Refusal.INVALID_INPUT,
            f"recommendation_id {shown!r} is not 1-256 printable non-space characters",
        )
    earlier = state.decided.get(rec_id)
    if earlier is not None:
        what = earlier.decision + (f" ({earlier.refusal})" if earlier.refusal else "")
        return out(Outcome.DUPLICATE, f"already decided at {earlier.ts_ms}: {what}")
    if not isinstance(raw_node, str) or not valid_node_name(raw_node):
        return refuse(Refusal.INVALID_INPUT, f"node {label!r} is not one plain Slurm node name")
    node: str = raw_node
    jobs_raw = rec.get("job_ids") or []
    if not isinstance(jobs_raw, list) or not all(
        isinstance(j, str) and JOB_ID.fullmatch(j) for j in jobs_raw
    ):
        return refuse(
            Refusal.INVALID_INPUT, f"job_ids {safe_label(repr(jobs_raw))} are not Slurm job ids"
        )
    job_ids = tuple(dict.fromkeys(jobs_raw))
    evidence_ms = rec.get("ts_ms")
    if isinstance(evidence_ms, bool) or not isinstance(evidence_ms, int):
        return refuse(Refusal.INVALID_INPUT, "ts_ms (the evidence time) is not an integer")
    if evidence_ms > now_ms + settings.future_skew_s * 1000:
        # A future time would pass every age check for as long as it stays ahead.
        return refuse(
            Refusal.INVALID_INPUT,
            f"ts_ms {evidence_ms} is more than {settings.future_skew_s} s ahead of now ({now_ms})",
        )
    raw_reason = rec.get("reason")
    slurm_reason = reasons.slurm_reason(
        raw_reason if isinstance(raw_reason, str) else "", settings.max_reason_chars
    )
    facts = cluster.nodes.get(node)
    hint = rec.get("partition")
    partitions = (
        facts.partitions if facts else ((safe_label(hint),) if isinstance(hint, str) else ())
    )
    expires = rec.get("expires_ms")
    common: dict[str, Any] = {
        "slurm_reason": slurm_reason, "partition": partitions[0] if partitions else None,
        "partitions": partitions, "job_ids": job_ids,
        "expires_ms": expires if isinstance(expires, int) else None,
    }  # fmt: skip

    action = rec.get("action")
    if action == "ALERT":
        return refuse(
            Refusal.ALERT_ONLY, "ALERT recommendations are audited, never drained", **common
        )
    if action != "DRAIN":
        return refuse(
            Refusal.INVALID_INPUT,
            f"action {safe_label(str(action))!r} is not DRAIN or ALERT",
            **common,
        )
    if facts is None:
        return refuse(Refusal.UNKNOWN_NODE, f"Slurm knows no node {node!r}", **common)

    ledger = state.ledger(enforce)
    if facts.ours:
        adopt = enforce and node not in ledger.drained
        return out(
            Outcome.DUPLICATE,
            f"node already drained by peerwatch (reason {safe_label(facts.reason or '', 128)!r})",
            adopt=adopt,
            **common,
        )
    if not enforce and node in ledger.drained:
        held = ledger.drained[node]
        return out(
            Outcome.DUPLICATE,
            f"shadow: node would already be drained (recommendation {held.recommendation_id})",
            **common,
        )
    if isinstance(expires, int) and expires <= now_ms:
        return refuse(
            Refusal.EXPIRED,
            f"the recommendation expired at {expires} ({(now_ms - expires) // 1000} s ago)",
            **common,
        )
    hard = bool(rec.get("hard"))
    max_age_s = settings.hard_max_age_s if hard else settings.max_age_s
    if now_ms - evidence_ms > max_age_s * 1000:
        return refuse(
            Refusal.STALE,
            f"evidence taken at {evidence_ms} is {(now_ms - evidence_ms) // 1000} s old, above the {'hard' if hard else 'soft'} freshness bound of {max_age_s} s",
            **common,
        )
    if facts.foreign:
        who = f" by {safe_label(facts.reason_user)}" if facts.reason_user else ""
        return refuse(
            Refusal.FOREIGN_REASON,
            f"node is {facts.state}{'+' if facts.flags else ''}{'+'.join(facts.flags)} with reason {safe_label(facts.reason or '', 128)!r} set{who}; not overwritten",
            **common,
        )
    if state.breaker.open:
        return refuse(
            Refusal.BREAKER_OPEN,
            f"circuit breaker open since {state.breaker.opened_ms} ({state.breaker.why}); run `peerwatch drain-controller reset-breaker`",
            **common,
        )
    resumed_ms = state.operator_resumes.get(node)
    if resumed_ms is not None and evidence_ms <= resumed_ms:
        # The operator looked at the node after this evidence: it says nothing about it now.
        return refuse(
            Refusal.EVIDENCE_BEFORE_RESUME,
            f"evidence taken at {evidence_ms}, an operator resumed the node after it, at {resumed_ms}",
            **common,
        )
    cooldown_ms = settings.operator_cooldown_s * 1000
    if resumed_ms is not None and now_ms - resumed_ms < cooldown_ms and not hard:
        return refuse(
            Refusal.OPERATOR_COOLDOWN,
            f"an operator resumed the node at {resumed_ms}; no soft drain before {resumed_ms + cooldown_ms}",
            **common,
        )
    since_ms = now_ms - settings.job_window_s * 1000
    for job in job_ids:
        count = ledger.drains_since(ledger.job_drains, job, since_ms)
        if count >= settings.max_drains_per_job:
            return refuse(
                Refusal.JOB_RATE_LIMIT,
                f"job {job} already had {count} drain(s) in the last {settings.job_window_s} s (max {settings.max_drains_per_job})",
                **common,
            )
    since_ms = now_ms - settings.partition_window_s * 1000
    for part in partitions:
        size = cluster.partition_size(part)
        allowed = _allowed(size, settings.partition_rate_pct, settings.partition_min_drains)
        count = ledger.drains_since(ledger.partition_drains, part, since_ms)
        if count + 1 > allowed:
            return refuse(
                Refusal.PARTITION_RATE_LIMIT,
                f"partition {part} ({size} nodes) allows {allowed} drain(s) per {settings.partition_window_s} s at {settings.partition_rate_pct}%, {count} done",
                **common,
            )
    for part in partitions:
        size = cluster.partition_size(part)
        holding = {n for n, d in ledger.drained.items() if part in d.partitions}
        if enforce:
            holding |= cluster.ours_in(part)
        limit = size * settings.breaker_pct / 100
        if len(holding) + 1 > limit + 1e-9:
            why = f"draining {node} would make {len(holding) + 1} of {size} nodes of partition {part} drained by peerwatch, above {settings.breaker_pct}%"
            if enforce:
                return refuse(
                    Refusal.BREAKER_OPEN,
                    f"circuit breaker opens: {why}",
                    open_breaker=why,
                    **common,
                )
            return refuse(
                Refusal.BREAKER_OPEN, f"shadow: the circuit breaker would open: {why}", **common
            )
    cluster_n = cluster.cluster_size
    cap = int(min(settings.max_drained_nodes, _allowed(cluster_n, settings.max_drained_pct, 0)))
    holding = set(ledger.drained) | (cluster.ours() if enforce else set())
    if len(holding) + 1 > cap:
        return refuse(
            Refusal.CLUSTER_CAP,
            f"{'shadow: ' if not enforce else ''}draining {node} would make {len(holding) + 1} of {cluster_n} nodes of the cluster drained by peerwatch, above the cap of {cap} (the lower of {settings.max_drained_nodes} nodes and {settings.max_drained_pct}%)",
            **common,
        )
    if enforce:
        return out(Outcome.DRAINED, f"drain {node}: {slurm_reason}", **common)
    return out(Outcome.SHADOWED, f"shadow: would drain {node}: {slurm_reason}", **common)


def apply_decision(state: ControllerState, decision: Decision, settings: DrainSettings) -> None:
    """Record a carried-out decision in ``state`` (mutated): the decided id, a drain in the
    ledger of the decision's mode, a latched breaker. An id already decided keeps its first record."""
    if decision.open_breaker:
        state.open_breaker(decision.open_breaker, decision.ts_ms)
    if decision.records_drain:
        hold = None
        if not decision.enforce:
            hold = decision.expires_ms or decision.ts_ms + settings.shadow_hold_s * 1000
        entry = DrainedNode(
            decision.node, decision.recommendation_id, decision.slurm_reason or "",
            decision.ts_ms, list(decision.partitions), decision.expires_ms, hold,
        )  # fmt: skip
        state.ledger(decision.enforce).add_drain(entry, list(decision.job_ids))
    rec_id = decision.recommendation_id
    # Every decision counts, DUPLICATEs of a drained node included: replayed after the node was
    # resumed, such a recommendation must not drain it then.
    if rec_id is not None and rec_id not in state.decided:
        refusal = str(decision.refusal) if decision.refusal else None
        state.decided[rec_id] = Decided(str(decision.outcome), refusal, decision.ts_ms)


def observe_node(state: ControllerState, facts: NodeFacts, ts_ms: int) -> str | None:
    """Fold one observation of a node (Slurm poll or NodeStateEvent at ``ts_ms``) into ``state``.

    A node peerwatch drained that is seen no longer held, by an observation newer than the drain,
    was resumed by an operator: the cooldown starts (returns ``"operator_resume"``). One seen held
    with someone else's reason is no longer ours (returns ``"taken_over"``). Else None.
    """
    entry = state.enforce.drained.get(facts.name)
    if entry is None or ts_ms <= entry.ts_ms:
        return None
    if not facts.drained:
        del state.enforce.drained[facts.name]
        state.operator_resumes[facts.name] = ts_ms
        return "operator_resume"
    if facts.foreign:
        del state.enforce.drained[facts.name]
        return "taken_over"
    return None


def expired_drains(state: ControllerState, now_ms: int) -> list[DrainedNode]:
    """Nodes peerwatch drained whose recommendation's ``expires_ms`` has passed (auto-resume)."""
    return [
        d
        for d in state.enforce.drained.values()
        if d.expires_ms is not None and d.expires_ms <= now_ms
    ]


def forget_resumed(state: ControllerState, node: str) -> DrainedNode | None:
    """peerwatch itself resumed ``node``: drop it from the ledger without starting a cooldown."""
    return state.enforce.drained.pop(node, None)
