"""Hard rules: evidence on one GPU that blames the GPU at any group size, at once.

DETECTION.md: hard XIDs, uncorrectable ECC, row-remap failure or pending, NVLink error counters
rising, PCIe link width below max, GPU lost from NVML. Application XIDs (13, 31, 43, 45, 68 by
default) are recorded and never blamed.

The rules are declared once, as data (:data:`HARD_RULES`); every evaluator reads that table:
:func:`hard_rules` on a closed window, the window prefilter
(:func:`~peerwatch.streams.core.window_columns.may_fire_columns` over :data:`MAY_FIRE_FIELDS`),
and the hard watch on arrival (:class:`~peerwatch.streams.core.hard_watch.HardWatch`, through the
compiled loop :func:`~peerwatch.streams.core.loops.hard_rules`, which takes its columns and bits
from the table). ``tests/unit/test_hard_rule_catalogue.py`` checks that they agree rule by rule.
A new rule is one row here (and, for a new kind, one branch in each evaluator).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from peerwatch.schemas.records import FindingCause, GpuWindow
from peerwatch.streams.core.settings import DetectorSettings

#: How a rule reads its evidence.
#: ``level``: a condition that fires when it turns on (on arrival: a reading's column non-zero
#: where the GPU's previous reading had it off; in a window: the window's flag field is set).
#: ``lost``: the ``level`` condition of a reading whose state is LOST (it carries no values).
#: ``rise``: a counter (the sum of the reading columns) rising over the GPU's previous reading
#: (after a reset: above zero); in a window: its delta field above zero.
#: ``below``: a value below its maximum (reading columns value, max; window fields min, max).
RuleKind = Literal["level", "lost", "rise", "below"]


@dataclass(frozen=True)
class HardRule:
    """One hard rule: its ``name`` (as findings list it), ``kind``, the GpuWindow fields a closed
    window shows it by (``window_fields``), the NodeGpuSample GPU-reading columns it is judged
    on at arrival (``reading_columns``), and the finding ``cause`` it names."""

    name: str
    kind: RuleKind
    window_fields: tuple[str, ...]
    reading_columns: tuple[str, ...]
    cause: FindingCause = "HARDWARE"


#: The NVLink error counters (replay + recovery + CRC), summed into one rule.
NVLINK_FIELDS = ("nvlink_replay_errors", "nvlink_recovery_errors", "nvlink_crc_errors")

#: Every hard rule but the XIDs (which fire by code: :func:`xid_category`). The order is the bit
#: order of the arrival loop's rule bits (bit ``1 << i`` for rule ``i``).
# fmt: off
HARD_RULES: tuple[HardRule, ...] = (
    HardRule("gpu_lost", "lost", ("lost",), ()),
    HardRule("remap_pending", "level", ("remap_pending",), ("remap_pending",)),
    HardRule("remap_failed", "level", ("remap_failed",), ("remap_failed",)),
    HardRule("pcie_width_degraded", "below", ("pcie_link_width_min", "pcie_link_width_max"),
             ("pcie_link_width", "pcie_link_width_max"), cause="LINK"),
    HardRule("ecc_uncorrected", "rise", ("ecc_uncorrected_delta",), ("ecc_volatile_uncorrected",)),
    HardRule("nvlink_errors", "rise", ("nvlink_errors_delta",), NVLINK_FIELDS, cause="LINK"),
)
# fmt: on
#: The rule of each name.
RULE_BY_NAME = {rule.name: rule for rule in HARD_RULES}
#: The window field that carries XIDs (a list; hard ones fire ``xid_<code>``).
XID_FIELD = "xids"
#: The GpuWindow fields on which some rule may fire when truthy (the prefilter's flags).
MAY_FIRE_FIELDS = (XID_FIELD, *(r.window_fields[0] for r in HARD_RULES if r.kind != "below"))
#: The (min, max) GpuWindow field pairs on which a ``below`` rule fires when min < max.
MAY_FIRE_BELOW = tuple((r.window_fields[0], r.window_fields[1]) for r in HARD_RULES
                       if r.kind == "below")  # fmt: skip

XID_HARD = "hard"
XID_APP = "app"
XID_OTHER = "other"


class RecordedXid(TypedDict):
    """One XID of a window (not an Avro record: drivers count them); fields as the window's."""

    job_id: str | None
    node: str | None
    gpu_index: int | None
    xid: int
    category: str
    window_start_ms: int | None


def xid_category(xid: int, settings: DetectorSettings) -> str:
    """``"hard"``, ``"app"`` (application fault, not blamed) or ``"other"``."""
    if xid in settings.hard_xids:
        return XID_HARD
    if xid in settings.app_xids:
        return XID_APP
    return XID_OTHER


def _count(value: int | None) -> int:
    return int(value) if value is not None else 0


def hard_rules(window: GpuWindow, settings: DetectorSettings) -> list[str]:
    """Names of the hard rules this GpuWindow fires, sorted (e.g. ``["ecc_uncorrected", "xid_79"]``).

    Counter deltas below zero (a counter reset after a driver reload) do not fire.
    """
    fields: Mapping[str, Any] = window  # read by the catalogue's field names
    rules: set[str] = set()
    for xid in fields.get(XID_FIELD) or ():
        if xid_category(int(xid), settings) == XID_HARD:
            rules.add(f"xid_{int(xid)}")
    for rule in HARD_RULES:
        if _fires(rule, fields):
            rules.add(rule.name)
    return sorted(rules)


def _fires(rule: HardRule, window: Mapping[str, Any]) -> bool:
    """Whether ``rule`` fires on a closed GpuWindow (its :attr:`HardRule.window_fields`)."""
    if rule.kind == "rise":
        return _count(window.get(rule.window_fields[0])) > 0
    if rule.kind == "below":
        low, high = (window.get(f) for f in rule.window_fields)
        return low is not None and high is not None and bool(low < high)
    return bool(window.get(rule.window_fields[0]))


def hard_cause(rules: list[str]) -> FindingCause:
    """LINK when every rule that fired names a link (PCIe, NVLink: :attr:`HardRule.cause`),
    else HARDWARE (XIDs and the GPU's own faults)."""
    causes = {RULE_BY_NAME[r].cause if r in RULE_BY_NAME else "HARDWARE" for r in rules}
    return "LINK" if causes == {"LINK"} else "HARDWARE"


def recorded_xids(window: GpuWindow, settings: DetectorSettings) -> list[RecordedXid]:
    """Every XID of the window as a small record (node, gpu_index, xid, category, window_start_ms),
    so drivers can count application XIDs without blaming anyone."""
    return [
        {
            "job_id": window.get("job_id"),
            "node": window.get("node"),
            "gpu_index": window.get("gpu_index"),
            "xid": xid,
            "category": xid_category(xid, settings),
            "window_start_ms": window.get("window_start_ms"),
        }
        for xid in sorted({int(x) for x in window.get("xids") or ()})
    ]
