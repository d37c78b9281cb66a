"""Pure node health checks over the NVML interface and a list of XID events.

Each check returns a list of CheckOutcome dicts (one per GPU where the check concerns a GPU).
Statuses follow DETECTION.md's hard rules: anything on that list is CRITICAL (the node must not
take the next job); a quantity the GPU does not support is OK with a "not supported" message.
Checks expect ``nvmlInit`` to have been called and never raise for NVML errors.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import pynvml

from peerwatch.producers.health.outcome import CRITICAL, OK, WARNING, outcome
from peerwatch.producers.nvml.device import NvmlApi, is_unsupported
from peerwatch.schemas.records import CheckOutcome

# DETECTION.md: hardware XIDs that blame the node, and ones that are usually the application's.
HARD_XIDS: frozenset[int] = frozenset({48, 63, 64, 74, 79, 92, 94, 95})
APPLICATION_XIDS: frozenset[int] = frozenset({13, 31, 43, 45, 68})

Handles = Sequence[tuple[int, Any]]


def _nvml_failure(name: str, index: int, exc: pynvml.NVMLError) -> CheckOutcome:
    if isinstance(exc, pynvml.NVMLError_GpuIsLost):
        return outcome(name, CRITICAL, f"GPU {index} is lost (fell off the bus)", index)
    return outcome(name, WARNING, f"GPU {index}: NVML error: {exc}", index)


def check_gpu_count(nvml: NvmlApi, expected: int | None) -> tuple[list[CheckOutcome], Handles]:
    """GPU count against ``expected`` (None: any count is fine) and a handle per GPU.

    Fewer GPUs than expected, or a GPU whose handle cannot be had, is CRITICAL; more than
    expected is WARNING (the node's configuration is out of date, its GPUs are fine).
    Returns the outcomes and the (index, handle) pairs the other checks use.
    """
    try:
        count = nvml.nvmlDeviceGetCount()
    except pynvml.NVMLError as exc:
        return [outcome("gpu_count", CRITICAL, f"nvmlDeviceGetCount failed: {exc}")], []
    results: list[CheckOutcome] = []
    handles: list[tuple[int, Any]] = []
    for index in range(count):
        try:
            handles.append((index, nvml.nvmlDeviceGetHandleByIndex(index)))
        except pynvml.NVMLError as exc:
            lost = isinstance(exc, pynvml.NVMLError_GpuIsLost)
            why = "is lost (fell off the bus)" if lost else f"handle unavailable: {exc}"
            results.append(outcome("gpu_count", CRITICAL, f"GPU {index} {why}", index))
    if expected is not None and count < expected:
        results.append(outcome("gpu_count", CRITICAL, f"{count} GPUs visible, {expected} expected"))
    elif expected is not None and count > expected:
        results.append(outcome("gpu_count", WARNING, f"{count} GPUs visible, {expected} expected"))
    else:
        results.append(outcome("gpu_count", OK, f"{count} GPUs visible"))
    return results, handles


def check_ecc(nvml: NvmlApi, handles: Handles) -> list[CheckOutcome]:
    """Uncorrectable volatile ECC errors (since driver load): > 0 is CRITICAL."""
    results = []
    for index, handle in handles:
        try:
            n = nvml.nvmlDeviceGetTotalEccErrors(
                handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
            )
        except pynvml.NVMLError as exc:
            if is_unsupported(exc):
                results.append(outcome("ecc_uncorrected", OK, "ECC not supported/enabled", index))
            else:
                results.append(_nvml_failure("ecc_uncorrected", index, exc))
            continue
        if n > 0:
            msg = f"{n} uncorrectable volatile ECC errors"
            results.append(outcome("ecc_uncorrected", CRITICAL, msg, index))
        else:
            results.append(outcome("ecc_uncorrected", OK, "no uncorrectable ECC errors", index))
    return results


def check_remap(nvml: NvmlApi, handles: Handles) -> list[CheckOutcome]:
    """Row remapping: a failed remap (replace the GPU) or a pending one (reset needed) is CRITICAL.

    Remapped rows alone are history, not a fault: they are only mentioned.
    """
    results = []
    for index, handle in handles:
        try:
            corr, unc, pending, failed = nvml.nvmlDeviceGetRemappedRows(handle)
        except pynvml.NVMLError as exc:
            if is_unsupported(exc):
                results.append(outcome("remap", OK, "row remapping not supported", index))
            else:
                results.append(_nvml_failure("remap", index, exc))
            continue
        rows = f"{corr} correctable / {unc} uncorrectable rows remapped"
        if failed:
            results.append(outcome("remap", CRITICAL, f"row remap FAILED ({rows})", index))
        elif pending:
            msg = f"row remap pending, GPU reset required ({rows})"
            results.append(outcome("remap", CRITICAL, msg, index))
        else:
            results.append(outcome("remap", OK, rows, index))
    return results


def check_pcie_width(nvml: NvmlApi, handles: Handles) -> list[CheckOutcome]:
    """PCIe link width below the GPU's maximum is CRITICAL (a degraded link slows every copy).

    Only width is checked: the link generation drops legitimately at idle to save power.
    """
    results = []
    for index, handle in handles:
        try:
            width = nvml.nvmlDeviceGetCurrPcieLinkWidth(handle)
            width_max = nvml.nvmlDeviceGetMaxPcieLinkWidth(handle)
        except pynvml.NVMLError as exc:
            if is_unsupported(exc):
                results.append(outcome("pcie_width", OK, "PCIe width not reported", index))
            else:
                results.append(_nvml_failure("pcie_width", index, exc))
            continue
        if width < width_max:
            msg = f"PCIe link x{width}, GPU supports x{width_max}"
            results.append(outcome("pcie_width", CRITICAL, msg, index))
        else:
            results.append(outcome("pcie_width", OK, f"PCIe link x{width}", index))
    return results


def check_xids(events: Iterable[dict[str, Any]]) -> list[CheckOutcome]:
    """XID events since the last check (XidEvent dicts), one outcome per GPU that had any.

    A hardware XID (``HARD_XIDS``) is CRITICAL; an application XID is OK (recorded, the node is
    not blamed); any other XID is WARNING. No events: one OK outcome.
    """
    by_gpu: dict[int, list[int]] = {}
    for event in events:
        by_gpu.setdefault(int(event["gpu_index"]), []).append(int(event["xid"]))
    if not by_gpu:
        return [outcome("xid", OK, "no XID events since the last check")]
    results = []
    for index in sorted(by_gpu):
        xids = by_gpu[index]
        codes = ", ".join(str(x) for x in sorted(set(xids)))
        if any(x in HARD_XIDS for x in xids):
            status, kind = CRITICAL, "hardware XID"
        elif all(x in APPLICATION_XIDS for x in xids):
            status, kind = OK, "application XID (node not blamed)"
        else:
            status, kind = WARNING, "XID"
        gpu_index = index if index >= 0 else None
        results.append(outcome("xid", status, f"{kind}: {codes} ({len(xids)} events)", gpu_index))
    return results
