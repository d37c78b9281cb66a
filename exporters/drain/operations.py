"""Operator commands on the controller's state and Slurm: reset the breaker, resume a node,
describe the state. Each runs under the state-file lock, so it is safe while a controller runs;
audit records go to the state's outbox (delivered by the caller or by the running controller)."""

from __future__ import annotations

from typing import Any

from peerwatch.errors import SlurmCommandError
from peerwatch.exporters.drain.audit import resume_record
from peerwatch.exporters.drain.decide import ClusterView, Refusal, forget_resumed
from peerwatch.exporters.drain.sanitize import safe_label, valid_node_name
from peerwatch.exporters.drain.slurm_ops import SlurmOps
from peerwatch.exporters.drain.state import StateStore
from peerwatch.schemas.records import DrainAction


def reset_breaker(store: StateStore, now_ms: int) -> str:
    """Close the circuit breaker; returns what it was (for the operator's terminal)."""
    with store.transaction() as state:
        why = state.breaker.why
        was_open = state.reset_breaker(now_ms)
    return f"breaker was open ({why}); now closed" if was_open else "breaker was already closed"


def resume_node(store: StateStore, slurm: SlurmOps, node: str, now_ms: int) -> DrainAction:
    """Resume ``node`` if, and only if, its current Slurm reason carries the peerwatch prefix.

    Returns the DrainAction (RESUMED, or REFUSED with invalid_input / unknown_node /
    foreign_reason / slurm_error), also queued in the state's outbox. A resume by peerwatch
    starts no operator cooldown. Raises SlurmCommandError when the node list cannot be read.
    """
    with store.transaction() as state:
        if not valid_node_name(node):
            action = resume_record(node, now_ms, f"invalid_input: {safe_label(node)!r} is not one plain node name", refusal=Refusal.INVALID_INPUT)  # fmt: skip
        else:
            facts = ClusterView.of(slurm.nodes()).nodes.get(node)
            part = facts.partitions[0] if facts and facts.partitions else None
            if facts is None:
                action = resume_record(node, now_ms, f"unknown_node: Slurm knows no node {node!r}", refusal=Refusal.UNKNOWN_NODE)  # fmt: skip
            elif not facts.ours:
                action = resume_record(
                    node, now_ms,
                    f"foreign_reason: node is {facts.state} with reason {safe_label(facts.reason or '', 128)!r}; only peerwatch drains are resumed",
                    refusal=Refusal.FOREIGN_REASON, partition=part, slurm_reason=facts.reason,
                )  # fmt: skip
            else:
                try:
                    slurm.resume(node)
                except SlurmCommandError as exc:
                    action = resume_record(node, now_ms, f"slurm_error: {exc}", refusal=Refusal.SLURM_ERROR, partition=part, slurm_reason=facts.reason)  # fmt: skip
                else:
                    entry = forget_resumed(state, node)
                    rec_id = entry.recommendation_id if entry else None
                    action = resume_record(node, now_ms, f"resumed on operator request (drained for {rec_id or 'an unrecorded recommendation'})", partition=part, slurm_reason=facts.reason)  # fmt: skip
        state.outbox.append(action)
    return action


def describe(store: StateStore, now_ms: int) -> dict[str, Any]:
    """A summary of the state for ``peerwatch drain-controller status`` (JSON-serialisable)."""
    state = store.load()
    return {
        "state_file": str(store.path),
        "now_ms": now_ms,
        "breaker": {"open": state.breaker.open, "why": state.breaker.why,
                    "opened_ms": state.breaker.opened_ms, "last_reset_ms": state.breaker.last_reset_ms},
        "drained_by_peerwatch": {n: {"recommendation_id": d.recommendation_id, "reason": d.reason,
                                     "ts_ms": d.ts_ms, "expires_ms": d.expires_ms}
                                 for n, d in sorted(state.enforce.drained.items())},
        "shadow_would_be_drained": sorted(state.shadow.drained),
        "operator_resumes_ms": dict(sorted(state.operator_resumes.items())),
        "decided_recommendations": len(state.decided),
        "undelivered_audit_records": len(state.outbox),
    }  # fmt: skip
