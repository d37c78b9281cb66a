"""Stage 4: the drain policy over findings, health results and node events (keyed by node).

The live worker's policy agent (:class:`~peerwatch.streams.live.handlers.PolicyHandler`) and
the in-process runner (:class:`~peerwatch.streams.core.pipeline.Pipeline`) both run this
object; a JOB_WIDE finding reaches it once per node, routed by stage 3
(:func:`~peerwatch.streams.core.job_stage.route_finding`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from peerwatch.schemas.records import DrainRecommendation
from peerwatch.streams.core.policy import apply as policy_apply
from peerwatch.streams.core.policy_state import DrainPolicyState
from peerwatch.streams.core.settings import PolicySettings


class PolicyStage:
    """Stage 4 (module docstring), its state one :class:`DrainPolicyState`."""

    def __init__(self, settings: PolicySettings) -> None:
        self.settings = settings
        self.state = DrainPolicyState()

    def apply(self, record: Mapping[str, Any]) -> list[DrainRecommendation]:
        """Recommendations for one record. Raises InvalidRecordError for a record the policy
        rejects."""
        return policy_apply(record, self.state, self.settings)

    def snapshot(self) -> dict[str, Any]:
        """The policy state, JSON-able."""
        return self.state.to_dict()

    def restore(self, data: Mapping[str, Any]) -> None:
        """State from :meth:`snapshot` (raises KeyError, TypeError, ValueError on a malformed
        one)."""
        self.state = DrainPolicyState.from_dict(data)
