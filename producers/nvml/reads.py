"""What peerwatch reads from NVML, and how: field-id names, per-tick and static reads, fallbacks.

Each read is a function (nvml, handle) -> {schema field: value}; several schema fields may come from
one call. ``probe`` decides per GPU which of these enter the per-tick plan.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pynvml

from peerwatch.producers.nvml.device import NvmlApi

# One read: (nvml, handle) -> {schema field: value}. Several schema fields may come from one call.
Read = Callable[[NvmlApi, Any], dict[str, Any]]

# Schema field -> components summed into it; each component lists alternative NVML field-id names,
# first one present in the binding wins. Throttle names changed over releases (THROTTLE -> CLOCKS
# EVENT); PERF_POLICY_POWER is the same counter (the current binding aliases the two).
FIELD_SPECS: Mapping[str, tuple[tuple[str, ...], ...]] = {
    "throttle_sw_power_cap_ns": (
        (
            "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP",
            "NVML_FI_DEV_CLOCKS_THROTTLE_REASON_SW_POWER_CAP",
            "NVML_FI_DEV_PERF_POLICY_POWER",
        ),
    ),
    "throttle_hw_slowdown_ns": (
        (
            "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_SLOWDOWN",
            "NVML_FI_DEV_CLOCKS_THROTTLE_REASON_HW_SLOWDOWN",
        ),
    ),
    "throttle_sw_thermal_ns": (
        (
            "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN",
            "NVML_FI_DEV_CLOCKS_THROTTLE_REASON_SW_THERM_SLOWDOWN",
        ),
    ),
    "throttle_hw_thermal_ns": (
        (
            "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
            "NVML_FI_DEV_CLOCKS_THROTTLE_REASON_HW_THERM_SLOWDOWN",
        ),
    ),
    "throttle_hw_power_brake_ns": (
        (
            "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN",
            "NVML_FI_DEV_CLOCKS_THROTTLE_REASON_HW_POWER_BRAKE_SLOWDOWN",
        ),
    ),
    "recovery_action": (("NVML_FI_DEV_GET_GPU_RECOVERY_ACTION",),),
    "memory_temperature_c": (("NVML_FI_DEV_MEMORY_TEMP",),),
    "ecc_volatile_corrected": (("NVML_FI_DEV_ECC_SBE_VOL_TOTAL",),),
    "ecc_volatile_uncorrected": (("NVML_FI_DEV_ECC_DBE_VOL_TOTAL",),),
    "ecc_aggregate_corrected": (("NVML_FI_DEV_ECC_SBE_AGG_TOTAL",),),
    "ecc_aggregate_uncorrected": (("NVML_FI_DEV_ECC_DBE_AGG_TOTAL",),),
    "pcie_replay_count": (("NVML_FI_DEV_PCIE_REPLAY_COUNTER",),),
    "nvlink_replay_errors": (("NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",),),
    "nvlink_recovery_errors": (("NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",),),
    "nvlink_crc_errors": (
        ("NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",),
        ("NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",),
    ),
}


def _utilization(nvml: NvmlApi, h: Any) -> dict[str, Any]:
    u = nvml.nvmlDeviceGetUtilizationRates(h)
    return {"gpu_util_pct": int(u.gpu), "mem_util_pct": int(u.memory)}


def _memory(nvml: NvmlApi, h: Any) -> dict[str, Any]:
    m = nvml.nvmlDeviceGetMemoryInfo(h)
    return {"memory_used_bytes": int(m.used), "memory_total_bytes": int(m.total)}


def _remapped_rows(nvml: NvmlApi, h: Any) -> dict[str, Any]:
    corr, unc, pending, failed = nvml.nvmlDeviceGetRemappedRows(h)
    return {
        "remapped_rows_correctable": int(corr),
        "remapped_rows_uncorrectable": int(unc),
        "remap_pending": bool(pending),
        "remap_failed": bool(failed),
    }


#: The energy counter's read: the costliest of a tick (about 3.2 ms of CPU per GPU on an H200,
#: most of the tick's NVML time; docs/operations.md), so it may be read less often than each tick.
ENERGY_READ = "nvmlDeviceGetTotalEnergyConsumption"

# Per-tick reads, keyed by the NVML function they call (the key names the read in error messages).
TICK_READS: Mapping[str, Read] = {
    "nvmlDeviceGetClockInfo(SM)": lambda n, h: {
        "sm_clock_mhz": n.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
    },
    "nvmlDeviceGetClockInfo(MEM)": lambda n, h: {
        "mem_clock_mhz": n.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)
    },
    "nvmlDeviceGetCurrentClocksEventReasons": lambda n, h: {
        "clocks_event_reasons": n.nvmlDeviceGetCurrentClocksEventReasons(h)
    },
    "nvmlDeviceGetPowerUsage": lambda n, h: {"power_mw": n.nvmlDeviceGetPowerUsage(h)},
    "nvmlDeviceGetEnforcedPowerLimit": lambda n, h: {
        "power_limit_mw": n.nvmlDeviceGetEnforcedPowerLimit(h)
    },
    ENERGY_READ: lambda n, h: {"energy_mj": n.nvmlDeviceGetTotalEnergyConsumption(h)},
    "nvmlDeviceGetTemperature(GPU)": lambda n, h: {
        "temperature_c": n.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
    },
    "nvmlDeviceGetUtilizationRates": _utilization,
    "nvmlDeviceGetMemoryInfo": _memory,
    "nvmlDeviceGetRemappedRows": _remapped_rows,
    "nvmlDeviceGetCurrPcieLinkWidth": lambda n, h: {
        "pcie_link_width": n.nvmlDeviceGetCurrPcieLinkWidth(h)
    },
    "nvmlDeviceGetCurrPcieLinkGeneration": lambda n, h: {
        "pcie_link_gen": n.nvmlDeviceGetCurrPcieLinkGeneration(h)
    },
}

# Capabilities that do not change while the driver is loaded: read once at probe time.
STATIC_READS: Mapping[str, Read] = {
    "nvmlDeviceGetMaxClockInfo(SM)": lambda n, h: {
        "sm_clock_max_mhz": n.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)
    },
    "nvmlDeviceGetMaxPcieLinkWidth": lambda n, h: {
        "pcie_link_width_max": n.nvmlDeviceGetMaxPcieLinkWidth(h)
    },
    "nvmlDeviceGetMaxPcieLinkGeneration": lambda n, h: {
        "pcie_link_gen_max": n.nvmlDeviceGetMaxPcieLinkGeneration(h)
    },
}

ECC_FALLBACK: Mapping[str, tuple[int, int]] = {
    "ecc_volatile_corrected": (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC),
    "ecc_volatile_uncorrected": (
        pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        pynvml.NVML_VOLATILE_ECC,
    ),
    "ecc_aggregate_corrected": (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC),
    "ecc_aggregate_uncorrected": (
        pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        pynvml.NVML_AGGREGATE_ECC,
    ),
}

# nvmlDeviceGetViolationStatus only knows power and (software) thermal policy time; the other
# throttle counters stay null without field values, and the stream falls back to the bitmask.
VIOLATION_FALLBACK: Mapping[str, int] = {
    "throttle_sw_power_cap_ns": pynvml.NVML_PERF_POLICY_POWER,
    "throttle_sw_thermal_ns": pynvml.NVML_PERF_POLICY_THERMAL,
}

NVLINK_FALLBACK: Mapping[str, tuple[int, ...]] = {
    "nvlink_replay_errors": (pynvml.NVML_NVLINK_ERROR_DL_REPLAY,),
    "nvlink_recovery_errors": (pynvml.NVML_NVLINK_ERROR_DL_RECOVERY,),
    "nvlink_crc_errors": (
        pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT,
        pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA,
    ),
}


def field_value(fv: Any) -> int | float | None:
    """The number in a ``c_nvmlFieldValue_t`` according to its ``valueType``; None if unknown."""
    vt = fv.valueType
    v = fv.value
    if vt == pynvml.NVML_VALUE_TYPE_DOUBLE:
        return float(v.dVal)
    if vt == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT:
        return int(v.uiVal)
    if vt == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return int(v.ulVal)
    if vt == pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG:
        return int(v.ullVal)
    if vt == pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return int(v.sllVal)
    if vt == pynvml.NVML_VALUE_TYPE_SIGNED_INT:
        return int(v.siVal)
    if vt == getattr(pynvml, "NVML_VALUE_TYPE_UNSIGNED_SHORT", -1):
        return int(v.usVal)
    return None


def nvlink_read(key: str, links: tuple[int, ...], counters: tuple[int, ...]) -> Read:
    def read(nvml: NvmlApi, h: Any) -> dict[str, Any]:
        total = 0
        for link in links:
            for counter in counters:
                total += nvml.nvmlDeviceGetNvLinkErrorCounter(h, link, counter)
        return {key: total}

    return read


def ecc_read(key: str, error_type: int, counter_type: int) -> Read:
    def read(nvml: NvmlApi, h: Any) -> dict[str, Any]:
        return {key: nvml.nvmlDeviceGetTotalEccErrors(h, error_type, counter_type)}

    return read


def violation_read(key: str, policy: int) -> Read:
    # violationTime is in ns (NVML's nvmlViolationTime_t); referenceTime (us) is not needed.
    def read(nvml: NvmlApi, h: Any) -> dict[str, Any]:
        return {key: int(nvml.nvmlDeviceGetViolationStatus(h, policy).violationTime)}

    return read
