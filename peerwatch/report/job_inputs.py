"""The inputs of :mod:`~peerwatch.report.job_summary`, checked: every record is hostile
(from Kafka, an archive, a replay). A record of the wrong shape is skipped and counted by reason
in :class:`Skips`, never raised; the ones kept have the fields the summary reads, typed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: Signals of the per-GPU table: (GpuWindow field, short name, relative to the peers?).
TABLE_SIGNALS: tuple[tuple[str, str, bool], ...] = (
    ("clk_ratio", "clk", True),
    ("sm_frac", "sm", True),
    ("power_w", "power", True),
    ("throttle_frac", "thr", False),
    ("step_ms", "step", True),
)
#: GpuWindow fields the summary reads: the table's, and the power ratio of the evidence.
WINDOW_FIELDS: tuple[str, ...] = (*(f for f, _, _ in TABLE_SIGNALS), "power_ratio")


class Bad(ValueError):
    """A record of the wrong shape; the message is the counted reason."""


def text(record: Mapping[str, Any], name: str) -> str:
    """A non-empty string field. Raises Bad."""
    value = record.get(name)
    if not isinstance(value, str) or not value:
        raise Bad(f"{name} missing")
    return value


def integer(record: Mapping[str, Any], name: str) -> int:
    """An integer field (not a bool). Raises Bad."""
    value = record.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise Bad(f"{name} not an integer")
    return value


def opt_integer(record: Mapping[str, Any], name: str) -> int | None:
    """An integer field or None. Raises Bad."""
    return None if record.get(name) is None else integer(record, name)


def number(record: Mapping[str, Any], name: str) -> float | None:
    """A finite number field; None for anything else (missing, NaN, inf, not a number)."""
    value = record.get(name)
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    out = float(value)
    return out if math.isfinite(out) else None


def array(value: Any) -> list[Any]:
    """A record's array field; anything else (a hostile record) reads as empty."""
    return value if isinstance(value, list) else []


class Skips:
    """Skipped records, counted by ``"kind: reason"``."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, kind: str, reason: str) -> None:
        key = f"{kind}: {reason}"
        self.counts[key] = self.counts.get(key, 0) + 1


@dataclass(frozen=True)
class Window:
    """One GpuWindow of the job, checked."""

    node: str
    gpu: int
    start_ms: int
    end_ms: int
    gated: bool
    score: float | None
    values: dict[str, float | None]


def windows_of(job_id: str, records: Iterable[Any], skips: Skips) -> list[Window]:
    """The GpuWindows of ``job_id`` among ``records``; bad ones counted in ``skips``."""
    out: list[Window] = []
    for r in records:
        try:
            if not isinstance(r, Mapping):
                raise Bad("not a record")
            if str(r.get("job_id")) != job_id:
                continue
            start = integer(r, "window_start_ms")
            end = opt_integer(r, "window_end_ms")
            out.append(
                Window(
                    node=text(r, "node"),
                    gpu=integer(r, "gpu_index"),
                    start_ms=start,
                    end_ms=end if end is not None and end > start else start,
                    gated=r.get("gated") is not None,
                    score=number(r, "score"),
                    values={f: number(r, f) for f in WINDOW_FIELDS},
                )
            )
        except Bad as exc:
            skips.add("window", str(exc))
    return out


def findings_of(job_id: str, records: Iterable[Any], skips: Skips) -> list[Mapping[str, Any]]:
    """The StragglerFindings of ``job_id`` with the fields the summary reads well typed."""
    out = []
    for r in records:
        if not isinstance(r, Mapping):
            skips.add("finding", "not a record")
            continue
        if str(r.get("job_id")) != job_id:
            continue
        try:
            integer(r, "window_start_ms")
            opt_integer(r, "window_end_ms")
            opt_integer(r, "first_flagged_ms")
            if not isinstance(r.get("status"), str):
                raise Bad("status missing")
            if not isinstance(r.get("features") or [], list) or not all(
                isinstance(e, Mapping) for e in r.get("features") or []
            ):
                raise Bad("features not a list of records")
            if not isinstance(r.get("hard_rules") or [], list):
                raise Bad("hard_rules not a list")
        except Bad as exc:
            skips.add("finding", str(exc))
            continue
        out.append(r)
    return out


def records_with_node(kind: str, records: Iterable[Any], skips: Skips) -> list[Mapping[str, Any]]:
    """The records that are mappings with a string ``node`` (recommendations, actions, node
    events); the others counted in ``skips`` as ``kind``."""
    out = []
    for r in records:
        if isinstance(r, Mapping) and isinstance(r.get("node"), str):
            out.append(r)
        else:
            skips.add(kind, "not a record with a node")
    return out
