"""Probe, once per agent run, which quantities each GPU supports and how to read them.

A read that raises NotSupported / NoPermission / FunctionNotFound at probe time is left out of the
GPU's plan: the quantity is published as null and never asked for again. Cheap per-tick reads are
batched into one ``nvmlDeviceGetFieldValues`` call per GPU; NVML field ids are resolved BY NAME from
the binding (``getattr(nvml, "NVML_FI_DEV_...", None)``) because ids and names differ between
nvidia-ml-py versions, and a name the installed binding lacks is skipped.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pynvml

from peerwatch.producers.nvml.device import NvmlApi, is_unsupported
from peerwatch.producers.nvml.reads import (
    ECC_FALLBACK,
    FIELD_SPECS,
    NVLINK_FALLBACK,
    STATIC_READS,
    TICK_READS,
    VIOLATION_FALLBACK,
    Read,
    ecc_read,
    nvlink_read,
    violation_read,
)

log = logging.getLogger(__name__)


@dataclass
class GpmState:
    """Two GPM sample buffers (previous, current) and a reusable metrics-get struct."""

    prev: Any
    cur: Any
    metrics: Any


@dataclass
class GpuProbe:
    """What one GPU supports and how to read it each tick (mutable: unsupported reads drop out)."""

    index: int
    handle: Any
    uuid: str = ""
    name: str | None = None
    pci_bus_id: str | None = None
    lost: bool = False
    error: str | None = None
    static: dict[str, Any] = field(default_factory=dict)
    reads: dict[str, Read] = field(default_factory=dict)
    field_ids: list[int] = field(default_factory=list)
    field_keys: dict[str, tuple[int, ...]] = field(default_factory=dict)
    gpm: GpmState | None = None
    unsupported: set[str] = field(default_factory=set)


def resolve_field_ids(source: object) -> dict[str, tuple[int, ...]]:
    """Map each schema field of ``FIELD_SPECS`` to the NVML field ids the binding defines.

    ``source`` is the nvml object (the pynvml module or a fake); names it lacks are skipped, and a
    schema field none of whose components resolve is left out.
    """
    resolved: dict[str, tuple[int, ...]] = {}
    for key, components in FIELD_SPECS.items():
        ids: list[int] = []
        for alternatives in components:
            for name in alternatives:
                fid = getattr(source, name, None)
                if isinstance(fid, int):
                    ids.append(fid)
                    break
        if ids:
            resolved[key] = tuple(ids)
    return resolved


def _try_read(nvml: NvmlApi, probe: GpuProbe, name: str, read: Read) -> tuple[bool, dict[str, Any]]:
    """Call ``read`` once. Returns (keep, values); GpuIsLost propagates.

    An error other than "unsupported" keeps the read (it may be transient) and is logged.
    """
    try:
        return True, read(nvml, probe.handle)
    except pynvml.NVMLError_GpuIsLost:
        raise
    except pynvml.NVMLError as exc:
        if is_unsupported(exc):
            probe.unsupported.add(name)
            return False, {}
        log.warning("GPU %d: %s failed at probe time: %s", probe.index, name, exc)
        return True, {}


def _probe_fields(nvml: NvmlApi, probe: GpuProbe, wanted: Mapping[str, tuple[int, ...]]) -> None:
    all_ids = sorted({fid for ids in wanted.values() for fid in ids})
    if not all_ids:
        return
    try:
        values = nvml.nvmlDeviceGetFieldValues(probe.handle, all_ids)
    except pynvml.NVMLError_GpuIsLost:
        raise
    except pynvml.NVMLError as exc:
        probe.unsupported.add("nvmlDeviceGetFieldValues")
        log.info("GPU %d: nvmlDeviceGetFieldValues unavailable: %s", probe.index, exc)
        return
    ok = {int(fv.fieldId) for fv in values if fv.nvmlReturn == pynvml.NVML_SUCCESS}
    for key, ids in wanted.items():
        supported = tuple(fid for fid in ids if fid in ok)
        if supported:
            probe.field_keys[key] = supported
    probe.field_ids = sorted({fid for ids in probe.field_keys.values() for fid in ids})


def _nvlink_links(nvml: NvmlApi, probe: GpuProbe) -> list[int]:
    links: list[int] = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if nvml.nvmlDeviceGetNvLinkState(probe.handle, link) == pynvml.NVML_FEATURE_ENABLED:
                links.append(link)
        except pynvml.NVMLError_GpuIsLost:
            raise
        except pynvml.NVMLError:
            # Links are numbered densely: the first one NVML rejects ends the list.
            break
    return links


def _fallback_reads(nvml: NvmlApi, probe: GpuProbe) -> dict[str, Read]:
    """Direct-call reads for schema fields that field values did not cover."""
    reads: dict[str, Read] = {}
    missing = set(FIELD_SPECS) - set(probe.field_keys)
    for key in sorted(missing & set(ECC_FALLBACK)):
        etype, ctype = ECC_FALLBACK[key]
        reads[f"nvmlDeviceGetTotalEccErrors({key})"] = ecc_read(key, etype, ctype)
    if "pcie_replay_count" in missing:
        reads["nvmlDeviceGetPcieReplayCounter"] = lambda n, h: {
            "pcie_replay_count": n.nvmlDeviceGetPcieReplayCounter(h)
        }
    for key in sorted(missing & set(VIOLATION_FALLBACK)):
        policy = VIOLATION_FALLBACK[key]
        reads[f"nvmlDeviceGetViolationStatus({key})"] = violation_read(key, policy)
    nvlink_missing = sorted(missing & set(NVLINK_FALLBACK))
    if nvlink_missing:
        links = tuple(_nvlink_links(nvml, probe))
        if links:
            for key in nvlink_missing:
                reads[f"nvmlDeviceGetNvLinkErrorCounter({key})"] = nvlink_read(
                    key, links, NVLINK_FALLBACK[key]
                )
    return reads


def _probe_gpm(nvml: NvmlApi, probe: GpuProbe) -> None:
    try:
        if not nvml.nvmlGpmQueryDeviceSupport(probe.handle).isSupportedDevice:
            probe.unsupported.add("gpm")
            return
        prev = nvml.nvmlGpmSampleAlloc()
        cur = nvml.nvmlGpmSampleAlloc()
    except pynvml.NVMLError_GpuIsLost:
        raise
    except pynvml.NVMLError as exc:
        probe.unsupported.add("gpm")
        log.info("GPU %d: GPM unavailable: %s", probe.index, exc)
        return
    metrics = pynvml.c_nvmlGpmMetricsGet_t()
    metrics.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    metrics.numMetrics = 1
    metrics.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
    probe.gpm = GpmState(prev=prev, cur=cur, metrics=metrics)
    try:
        # The first SM activity value covers probe -> first tick.
        nvml.nvmlGpmSampleGet(probe.handle, prev)
    except pynvml.NVMLError as exc:
        free_gpm(nvml, probe)
        if isinstance(exc, pynvml.NVMLError_GpuIsLost):
            raise
        probe.unsupported.add("gpm")
        log.info("GPU %d: GPM sample failed: %s", probe.index, exc)


def free_gpm(nvml: NvmlApi, probe: GpuProbe) -> None:
    """Release the GPU's GPM sample buffers, if any. Never raises."""
    if probe.gpm is None:
        return
    for sample in (probe.gpm.prev, probe.gpm.cur):
        try:
            nvml.nvmlGpmSampleFree(sample)
        except pynvml.NVMLError as exc:
            log.debug("GPU %d: nvmlGpmSampleFree: %s", probe.index, exc)
    probe.gpm = None


def _bus_id(pci: Any) -> str:
    raw = pci.busId
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)


def probe_gpu(nvml: NvmlApi, index: int, field_ids: Mapping[str, tuple[int, ...]]) -> GpuProbe:
    """Probe GPU ``index``: identity, static capabilities, and the per-tick read plan.

    Never raises for NVML errors: a lost GPU gives ``lost=True``; another failure to reach the
    handle gives ``error`` set (the sampler then reports the GPU as ERROR).
    """
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except pynvml.NVMLError as exc:
        lost = isinstance(exc, pynvml.NVMLError_GpuIsLost)
        return GpuProbe(index=index, handle=None, lost=lost, error=f"handle: {exc}")
    probe = GpuProbe(index=index, handle=handle)
    try:
        probe.uuid = nvml.nvmlDeviceGetUUID(handle)
        probe.name = nvml.nvmlDeviceGetName(handle)
        probe.pci_bus_id = _bus_id(nvml.nvmlDeviceGetPciInfo(handle))
        for name, read in STATIC_READS.items():
            probe.static.update(_try_read(nvml, probe, name, read)[1])
        for name, read in TICK_READS.items():
            if _try_read(nvml, probe, name, read)[0]:
                probe.reads[name] = read
        _probe_fields(nvml, probe, field_ids)
        for name, read in _fallback_reads(nvml, probe).items():
            if _try_read(nvml, probe, name, read)[0]:
                probe.reads[name] = read
        _probe_gpm(nvml, probe)
    except pynvml.NVMLError_GpuIsLost as exc:
        probe.lost = True
        probe.error = str(exc)
        free_gpm(nvml, probe)
    except pynvml.NVMLError as exc:
        # Identity could not be read: keep what we have, report ERROR every tick.
        probe.error = f"probe: {exc}"
    return probe


def probe_gpus(nvml: NvmlApi, field_source: object | None = None) -> list[GpuProbe]:
    """Probe every GPU NVML reports. ``nvmlInit`` must have been called.

    ``field_source`` is where NVML field-id names are resolved (default: ``nvml`` itself).
    Raises ``pynvml.NVMLError`` only if ``nvmlDeviceGetCount`` fails.
    """
    field_ids = resolve_field_ids(nvml if field_source is None else field_source)
    count = nvml.nvmlDeviceGetCount()
    return [probe_gpu(nvml, i, field_ids) for i in range(count)]
