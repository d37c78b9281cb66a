"""Hard rules: evidence on one GPU window that blames the GPU at any group size, at once.

DETECTION.md: hard XIDs, uncorrectable ECC, row-remap failure or pending, NVLink error counters
rising, PCIe link width below max, GPU lost from NVML. Application XIDs (13, 31, 43, 45, 68 by
default) are recorded and never blamed.
"""

from __future__ import annotations

from typing import TypedDict

from peerwatch.schemas.records import GpuWindow
from peerwatch.streams.core.settings import DetectorSettings

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
    rules: set[str] = set()
    for xid in window.get("xids") or ():
        if xid_category(int(xid), settings) == XID_HARD:
            rules.add(f"xid_{int(xid)}")
    if _count(window.get("ecc_uncorrected_delta")) > 0:
        rules.add("ecc_uncorrected")
    if window.get("remap_failed"):
        rules.add("remap_failed")
    if window.get("remap_pending"):
        rules.add("remap_pending")
    if _count(window.get("nvlink_errors_delta")) > 0:
        rules.add("nvlink_errors")
    width_min = window.get("pcie_link_width_min")
    width_max = window.get("pcie_link_width_max")
    if width_min is not None and width_max is not None and width_min < width_max:
        rules.add("pcie_width_degraded")
    if window.get("lost"):
        rules.add("gpu_lost")
    return sorted(rules)


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
