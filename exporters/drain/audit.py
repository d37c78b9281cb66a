"""DrainAction records (the audit trail on ``peerwatch.drain.actions``) built from decisions."""

from __future__ import annotations

from peerwatch.exporters.drain.decide import Decision, Outcome, Refusal
from peerwatch.exporters.drain.sanitize import safe_label
from peerwatch.schemas.records import DrainAction, DrainDecision

#: An outcome -> the schema's enum value (narrows the StrEnum without a cast).
_DECISION: dict[Outcome, DrainDecision] = {
    Outcome.DRAINED: "DRAINED",
    Outcome.RESUMED: "RESUMED",
    Outcome.REFUSED: "REFUSED",
    Outcome.SHADOWED: "SHADOWED",
    Outcome.DUPLICATE: "DUPLICATE",
}


def action_record(decision: Decision, fallback_id: str | None = None) -> DrainAction:
    """The DrainAction for ``decision``. ``action_id`` is ``<recommendation id>:<DECISION>``;
    without a usable recommendation id it is ``invalid:<fallback_id>`` (e.g. topic/partition/offset)."""
    rec_id = decision.recommendation_id
    base = rec_id if rec_id is not None else f"invalid:{fallback_id or decision.ts_ms}"
    return {
        "action_id": f"{base}:{decision.outcome}",
        "recommendation_id": rec_id,
        "node": decision.node,
        "ts_ms": decision.ts_ms,
        "decision": _DECISION[decision.outcome],
        "mode": decision.mode,
        "refusal": str(decision.refusal) if decision.refusal else None,
        "slurm_reason": decision.slurm_reason,
        "partition": decision.partition,
        "detail": decision.detail,
    }


def invalid_record(key: bytes | None, detail: str, enforce: bool, now_ms: int) -> Decision:
    """The decision for a record that cannot be decoded: refused as ``invalid_input``."""
    node = safe_label(key.decode("utf-8", "replace")) if key else "?"
    return Decision(
        Outcome.REFUSED, node, now_ms, enforce, f"invalid_input: {safe_label(detail, 400)}",
        refusal=Refusal.INVALID_INPUT,
    )  # fmt: skip


def resume_record(
    node: str,
    ts_ms: int,
    detail: str,
    *,
    recommendation_id: str | None = None,
    refusal: Refusal | None = None,
    partition: str | None = None,
    slurm_reason: str | None = None,
) -> DrainAction:
    """A DrainAction for a resume (RESUMED, or REFUSED with ``refusal``). ``recommendation_id``
    is None for operator-requested resumes, the expired recommendation's id for auto-resumes."""
    decision = Outcome.REFUSED if refusal else Outcome.RESUMED
    base = recommendation_id if recommendation_id else f"resume:{node}:{ts_ms}"
    return {
        "action_id": f"{base}:{decision}",
        "recommendation_id": recommendation_id,
        "node": safe_label(node),
        "ts_ms": ts_ms,
        "decision": _DECISION[decision],
        "mode": "ENFORCE",
        "refusal": str(refusal) if refusal else None,
        "slurm_reason": slurm_reason,
        "partition": partition,
        "detail": detail,
    }
