"""Explicit, serialisable drain-policy state (one ``NodePolicyState`` per node).

The live stream keeps ``NodePolicyState.to_dict()`` (or a whole ``DrainPolicyState``) in a
changelog-backed table keyed by node; replay and evaluation keep one ``DrainPolicyState`` for
all nodes. Everything is plain JSON types.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Episode:
    """An open node-level episode (hard error, health) and when its recommendation expires."""

    start_ms: int
    expires_ms: int


@dataclass
class StragglerTrack:
    """A confirmed straggler episode of one GPU in one job on this node."""

    job_id: str
    gpu_index: int
    first_flagged_ms: int
    confirmed_ms: int
    last_ms: int
    hw_evidence: bool
    finding_id: str
    detail: str


@dataclass
class RepeatEntry:
    """A job in which this node had a confirmed straggler with clock/throttle evidence."""

    job_id: str
    gpu_index: int
    last_ms: int
    finding_id: str
    detail: str


@dataclass
class NodePolicyState:
    """What the policy remembers about one node.

    ``emitted`` maps each recommendation id already emitted to its ``expires_ms``, so the same
    recommendation is never emitted twice for the same episode.
    """

    node: str
    partition: str | None = None
    out_of_service: bool = False
    resumed_ms: int | None = None
    episodes: dict[str, Episode] = field(default_factory=dict)
    stragglers: dict[str, StragglerTrack] = field(default_factory=dict)
    repeat: dict[str, RepeatEntry] = field(default_factory=dict)
    emitted: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> NodePolicyState:
        return cls(
            node=str(data["node"]),
            partition=data.get("partition"),
            out_of_service=bool(data.get("out_of_service")),
            resumed_ms=data.get("resumed_ms"),
            episodes={k: Episode(**v) for k, v in (data.get("episodes") or {}).items()},
            stragglers={k: StragglerTrack(**v) for k, v in (data.get("stragglers") or {}).items()},
            repeat={k: RepeatEntry(**v) for k, v in (data.get("repeat") or {}).items()},
            emitted={str(k): int(v) for k, v in (data.get("emitted") or {}).items()},
        )


@dataclass
class DrainPolicyState:
    """Policy state of any number of nodes (a live worker holds one node per table entry)."""

    nodes: dict[str, NodePolicyState] = field(default_factory=dict)

    def node(self, name: str) -> NodePolicyState:
        """The state of node ``name``, created empty on first use."""
        state = self.nodes.get(name)
        if state is None:
            state = self.nodes[name] = NodePolicyState(node=name)
        return state

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": {k: self.nodes[k].to_dict() for k in sorted(self.nodes)}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DrainPolicyState:
        return cls(
            nodes={
                str(k): NodePolicyState.from_dict(v) for k, v in (data.get("nodes") or {}).items()
            }
        )
