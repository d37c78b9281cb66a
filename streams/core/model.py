"""Types shared by the detector and the drain policy: job context, ids, record errors.

Records stay plain dicts as fastavro reads them (times are int ms since the epoch, UTC), typed
by the TypedDicts of :mod:`peerwatch.schemas.records`; the types here are the small pieces of
context and identity that are not records themselves.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Final

from peerwatch.errors import PeerwatchError

# Final: their types are the literals, so they fit the FindingStatus of StragglerFinding.
SUSPECT: Final = "SUSPECT"
CONFIRMED: Final = "CONFIRMED"
CLEARED: Final = "CLEARED"
JOB_WIDE: Final = "JOB_WIDE"
HARD_ERROR: Final = "HARD_ERROR"
SILENT: Final = "SILENT"
FLEET_WIDE: Final = "FLEET_WIDE"

#: Readings of GPUs no job owns are grouped per node under this pseudo job id ("idle:<node>"):
#: hard errors on an idle GPU must drain the node before the next job lands on it, while peer
#: comparison never runs on them (the detector gates them as ``idle``).
IDLE_JOB_PREFIX = "idle:"


def is_idle_job(job_id: str | None) -> bool:
    """True for the pseudo job that holds a node's unallocated GPUs."""
    return bool(job_id) and str(job_id).startswith(IDLE_JOB_PREFIX)


class InvalidRecordError(PeerwatchError):
    """A record handed to the detector or the policy lacks a field or mixes jobs/windows.

    Drivers catch it and send the record to the dead-letter topic.
    """


def stable_id(*parts: object, hex_chars: int = 32) -> str:
    """Deterministic id: sha256 of the parts joined by a unit separator, truncated hex.

    ``None`` and the empty string are distinguished so that (None, "a") != ("", "a").
    """
    text = "\x1f".join("\x00" if p is None else str(p) for p in parts)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:hex_chars]


def field_rows(records: Sequence[Mapping[str, Any]], *names: str) -> list[Any]:
    """``r.get(name)`` of every record for one name, ``(r.get(name), ...)`` for several: the
    lookups in C where every record holds every field (as the GpuWindow dicts the aggregator
    and the decoder make do), one by one where one lacks any."""
    try:
        return list(map(itemgetter(*names), records))
    except KeyError:
        if len(names) == 1:
            return [r.get(names[0]) for r in records]
        return [tuple(r.get(name) for name in names) for r in records]


_KEY = "{}/{}".format


def gpu_key(node: str, gpu_index: int) -> str:
    """Key of one GPU inside a job's state: ``node/index`` (a JSON-friendly dict key)."""
    return _KEY(node, gpu_index)


def gpu_keys(nodes: Iterable[str], gpu_indexes: Iterable[int]) -> list[str]:
    """:func:`gpu_key` of each (node, GPU index) pair, the loop in C."""
    return list(map(_KEY, nodes, gpu_indexes))


def require(record: Mapping[str, object], *names: str, what: str) -> None:
    """Raise InvalidRecordError naming the first of ``names`` missing (or None) in ``record``."""
    for name in names:
        if record.get(name) is None:
            raise InvalidRecordError(f"{what} record lacks {name!r}")


@dataclass(frozen=True)
class JobContext:
    """What the detector knows about a job besides its windows.

    ``expected_gpus``: GPUs the job owns (sum over its allocations); None when unknown, then the
    most GPUs ever seen in one window stands in. ``start_ms``/``requeue_ms``: job start and last
    requeue (int ms, UTC), used for the warm-up gate; a newer ``requeue_ms`` (or ``start_ms``)
    than the state has seen resets per-GPU persistence. ``roles`` maps ``node/index`` (see
    :func:`gpu_key`) to a role label (pipeline stage, GPU model, MIG profile); peers are only
    compared within one role. GPUs without a role form the group ``""``.
    """

    job_id: str
    expected_gpus: int | None = None
    start_ms: int | None = None
    requeue_ms: int | None = None
    partition: str | None = None
    roles: Mapping[str, str] = field(default_factory=dict)
    #: Job end (int ms, UTC) once known: windows of the job's last moments are gated ("ending"),
    #: since teardown makes every GPU look slow against its own baseline.
    end_ms: int | None = None

    @property
    def anchor_ms(self) -> int | None:
        """Latest of start and requeue: the warm-up is counted from here."""
        known = [t for t in (self.start_ms, self.requeue_ms) if t is not None]
        return max(known) if known else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "expected_gpus": self.expected_gpus,
            "start_ms": self.start_ms,
            "requeue_ms": self.requeue_ms,
            "partition": self.partition,
            "roles": dict(self.roles),
            "end_ms": self.end_ms,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobContext:
        require(data, "job_id", what="JobContext")
        return cls(
            job_id=str(data["job_id"]),
            expected_gpus=data.get("expected_gpus"),
            start_ms=data.get("start_ms"),
            requeue_ms=data.get("requeue_ms"),
            partition=data.get("partition"),
            roles=dict(data.get("roles") or {}),
            end_ms=data.get("end_ms"),
        )
