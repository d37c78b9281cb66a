"""Test doubles shared by the unit tests.

``FakeNvml`` is a drop-in for the part of the ``pynvml`` module peerwatch uses
(``peerwatch.producers.nvml.device.NvmlApi``). It behaves like real NVML where tests can tell:

* it raises the real ``pynvml.NVMLError_*`` classes, built as pynvml builds them
  (``pynvml.NVMLError(code)`` picks the subclass);
* every call before ``nvmlInit`` raises ``NVMLError_Uninitialized``; ``library_missing=True`` makes
  ``nvmlInit`` raise ``NVMLError_LibraryNotFound`` (a node without a driver);
* handles, event sets and GPM samples are real ctypes pointers (``c_nvmlDevice_t`` ...), so the code
  under test meets the same opaque types it gets from the binding; structs returned are pynvml's own
  (``c_nvmlFieldValue_t`` arrays, ``c_nvmlUtilization_t``, ``c_nvmlEventData_t``, ...);
* once a GPU is lost, every call on its handle raises ``NVMLError_GpuIsLost``;
* ``nvmlEventSetWait_v2`` blocks up to the timeout and raises ``NVMLError_Timeout`` when idle;
* NVML constants (``NVML_FI_DEV_*`` ...) are the binding's; ``hidden_names`` removes some, to act
  like an older binding that lacks them.

Configure GPUs with ``FakeGpu`` (``FakeGpu.h100()``, ``FakeGpu.h200()``, ``FakeGpu.a100()`` or fields by hand). A value
may be a zero-argument callable, called on every read (dynamic counters). ``calls`` counts calls by
(function name, GPU index).
"""

from __future__ import annotations

import collections
import ctypes
import functools
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pynvml

NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
ULL = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
UINT = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT

THROTTLE_REASONS = ("sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake")
_REASON_BITS = {
    "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
    "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "sw_thermal": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "hw_thermal": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    "hw_power_brake": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
}


def nvml_error(code: int) -> pynvml.NVMLError:
    """The exception pynvml raises for return code ``code`` (the right subclass)."""
    return pynvml.NVMLError(code)


def _v(value: Any) -> Any:
    return value() if callable(value) else value


@dataclass
class FakeGpu:
    """One simulated GPU. Units as NVML gives them (mW, mJ, bytes, MHz, C, ns)."""

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = ""
    pci_bus_id: str = ""
    # pynvml function names that raise NotSupported on this GPU, and names -> error code to raise.
    unsupported: set[str] = field(default_factory=set)
    fail: dict[str, int] = field(default_factory=dict)
    # NVML field-id NAMES this GPU answers; None = every field the fake knows.
    fields_supported: set[str] | None = None
    gpm_supported: bool = True
    supported_events: int = (
        pynvml.nvmlEventTypeXidCriticalError | pynvml.nvmlEventTypeSingleBitEccError
    )

    sm_clock_mhz: Any = 1980
    sm_clock_max_mhz: Any = 1980
    mem_clock_mhz: Any = 2619
    clocks_event_reasons: Any = 0
    power_mw: Any = 650_000
    power_limit_mw: Any = 700_000
    energy_mj: Any = 1_000_000_000
    temperature_c: Any = 55
    memory_temperature_c: Any = 62
    gpu_util_pct: Any = 100
    mem_util_pct: Any = 45
    sm_active_pct: Any = 87.5
    memory_total_bytes: Any = 85_520_809_984
    memory_used_bytes: Any = 70_000_000_000
    # (memory error type, counter type) -> count
    ecc: dict[tuple[int, int], Any] = field(default_factory=dict)
    remapped_rows: Any = (0, 0, 0, 0)  # correctable, uncorrectable, pending, failed
    pcie_replay_count: Any = 0
    pcie_link_width: Any = 16
    pcie_link_width_max: Any = 16
    pcie_link_gen: Any = 5
    pcie_link_gen_max: Any = 5
    nvlink_links: int = 18
    # (link, NVML_NVLINK_ERROR_DL_*) -> count; missing = 0
    nvlink_errors: dict[tuple[int, int], Any] = field(default_factory=dict)
    throttle_ns: dict[str, Any] = field(default_factory=lambda: dict.fromkeys(THROTTLE_REASONS, 0))
    recovery_action: Any = 0
    lost: bool = False

    @classmethod
    def h100(cls, index: int = 0, **overrides: Any) -> FakeGpu:
        """An H100 SXM: everything supported, GPM included."""
        gpu = cls(
            uuid=f"GPU-{index:08x}-1111-2222-3333-{index:012x}",
            pci_bus_id=f"00000000:{0x18 + index * 0x10:02X}:00.0",
        )
        for key, value in overrides.items():
            setattr(gpu, key, value)
        return gpu

    @classmethod
    def h200(cls, index: int = 0, **overrides: Any) -> FakeGpu:
        """An H200 as one answered through NVML (driver 580, a PCIe-attached GPU in a VM; the
        recording is ``tests/data/nvml/h200``): GPM, no NVLink, 700 W, 141 GiB."""
        gpu = cls.h100(index, name="NVIDIA H200", nvlink_links=0, mem_clock_mhz=3201,
                       memory_total_bytes=150_754_820_096)  # fmt: skip
        gpu.fields_supported = {
            name for name in gpu.field_table() if not name.startswith("NVML_FI_DEV_NVLINK_")
        }
        for key, value in overrides.items():
            setattr(gpu, key, value)
        return gpu

    @classmethod
    def a100(cls, index: int = 0, **overrides: Any) -> FakeGpu:
        """An A100 SXM (Ampere): no GPM, 12 NVLinks, 400 W limit."""
        gpu = cls.h100(index, name="NVIDIA A100-SXM4-80GB", gpm_supported=False)
        gpu.nvlink_links, gpu.power_limit_mw, gpu.sm_clock_max_mhz = 12, 400_000, 1410
        gpu.sm_clock_mhz, gpu.pcie_link_gen, gpu.pcie_link_gen_max = 1410, 4, 4
        for key, value in overrides.items():
            setattr(gpu, key, value)
        return gpu

    def field_table(self) -> dict[str, tuple[int, Callable[[], Any]]]:
        """NVML field-id name -> (value type, reader) for every field this fake knows."""
        t: dict[str, tuple[int, Callable[[], Any]]] = {
            "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP": (
                ULL,
                lambda: self.throttle_ns["sw_power_cap"],
            ),
            "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_THERM_SLOWDOWN": (
                ULL,
                lambda: self.throttle_ns["sw_thermal"],
            ),
            "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN": (
                ULL,
                lambda: self.throttle_ns["hw_thermal"],
            ),
            "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_POWER_BRAKE_SLOWDOWN": (
                ULL,
                lambda: self.throttle_ns["hw_power_brake"],
            ),
            "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION": (UINT, lambda: self.recovery_action),
            "NVML_FI_DEV_MEMORY_TEMP": (UINT, lambda: self.memory_temperature_c),
            # an unsigned int, as an H200 answers it (tests/data/nvml/h200)
            "NVML_FI_DEV_PCIE_REPLAY_COUNTER": (UINT, lambda: self.pcie_replay_count),
        }
        ce, ue = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        vol, agg = pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC
        for name, key in (
            ("SBE_VOL", (ce, vol)),
            ("DBE_VOL", (ue, vol)),
            ("SBE_AGG", (ce, agg)),
            ("DBE_AGG", (ue, agg)),
        ):
            t[f"NVML_FI_DEV_ECC_{name}_TOTAL"] = (ULL, functools.partial(self.ecc_count, key))
        for name, counter in (
            ("REPLAY_ERROR_COUNT", pynvml.NVML_NVLINK_ERROR_DL_REPLAY),
            ("RECOVERY_ERROR_COUNT", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY),
            ("CRC_FLIT_ERROR_COUNT", pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
            ("CRC_DATA_ERROR_COUNT", pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA),
        ):
            t[f"NVML_FI_DEV_NVLINK_{name}_TOTAL"] = (
                ULL,
                functools.partial(self.nvlink_total, counter),
            )
        return t

    def ecc_count(self, key: tuple[int, int]) -> int:
        return int(_v(self.ecc.get(key, 0)))

    def nvlink_total(self, counter: int) -> int:
        return sum(
            _v(self.nvlink_errors.get((link, counter), 0)) for link in range(self.nvlink_links)
        )


class _Registry:
    """Real ctypes pointers of a given type, each backed by its own buffer, mapped to a payload."""

    def __init__(self, ptr_type: Any) -> None:
        self._ptr_type = ptr_type
        self._buffers: dict[int, Any] = {}
        self.payload: dict[int, Any] = {}

    def new(self, payload: Any) -> Any:
        buf = ctypes.create_string_buffer(8)
        addr = ctypes.addressof(buf)
        self._buffers[addr] = buf
        self.payload[addr] = payload
        return ctypes.cast(buf, self._ptr_type)

    def lookup(self, ptr: Any) -> Any:
        try:
            addr = ctypes.cast(ptr, ctypes.c_void_p).value
        except (ctypes.ArgumentError, TypeError):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT) from None
        if addr not in self.payload:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.payload[addr]

    def free(self, ptr: Any) -> None:
        addr = ctypes.cast(ptr, ctypes.c_void_p).value
        if addr is None or self.payload.pop(addr, None) is None:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._buffers.pop(addr, None)


@dataclass
class _EventSet:
    registered: dict[int, int] = field(default_factory=dict)  # gpu index -> event mask
    queue: collections.deque[tuple[int, int, int]] = field(default_factory=collections.deque)


@dataclass
class _GpmSample:
    gpu: int | None = None
    sm_active_pct: float | None = None


class FakeNvml:
    """A fake ``pynvml`` module for the given GPUs (see the module docstring)."""

    def __init__(
        self,
        gpus: Iterable[FakeGpu] = (),
        *,
        driver_version: str = "550.90.07",
        library_missing: bool = False,
        hidden_names: Iterable[str] = (),
    ) -> None:
        self.gpus = list(gpus)
        self.driver_version = driver_version
        self.library_missing = library_missing
        self.hidden_names = set(hidden_names)
        self.calls: collections.Counter[tuple[str, int | None]] = collections.Counter()
        self._init_count = 0
        self._lock = threading.Lock()
        self._events = threading.Condition(self._lock)
        self._handles = _Registry(pynvml.c_nvmlDevice_t)
        self._handle_of = [self._handles.new(i) for i in range(len(self.gpus))]
        self._sets = _Registry(pynvml.c_nvmlEventSet_t)
        self._gpm = _Registry(pynvml.c_nvmlGpmSample_t)

    # -- constants ---------------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        # Only constants are forwarded: an unimplemented *function* must fail loudly.
        if (
            name.startswith(("NVML_", "nvmlEventType", "nvmlClocks"))
            and name not in self.hidden_names
        ):
            value = getattr(pynvml, name)
            if not callable(value):
                return value
        raise AttributeError(name)

    # -- test controls -----------------------------------------------------------------------

    def count(self, name: str, index: int | None = None) -> int:
        """How often function ``name`` was called (on GPU ``index``, or in all)."""
        return sum(
            n for (fn, i), n in self.calls.items() if fn == name and (index is None or i == index)
        )

    def lose_gpu(self, index: int, xid: int | None = 79) -> None:
        """The GPU falls off the bus: XID ``xid`` is delivered first (None: none), then every call
        on its handle raises GpuIsLost."""
        if xid is not None:
            self.inject_xid(index, xid)
        self.gpus[index].lost = True

    def inject_xid(self, index: int, xid: int) -> None:
        """Raise an XID critical error on GPU ``index`` (delivered to sets registered for it)."""
        with self._events:
            for es in self._sets.payload.values():
                if es.registered.get(index, 0) & pynvml.nvmlEventTypeXidCriticalError:
                    es.queue.append((index, pynvml.nvmlEventTypeXidCriticalError, xid))
            self._events.notify_all()

    def advance(self, ms: int) -> None:
        """Let ``ms`` of GPU time pass: energy and the active throttle reasons' counters grow."""
        for gpu in self.gpus:
            if isinstance(gpu.energy_mj, int):
                gpu.energy_mj += _v(gpu.power_mw) * ms // 1000
            reasons = _v(gpu.clocks_event_reasons)
            for reason, bit in _REASON_BITS.items():
                if reasons & bit and isinstance(gpu.throttle_ns[reason], int):
                    gpu.throttle_ns[reason] += ms * 1_000_000

    # -- plumbing ----------------------------------------------------------------------------

    def _enter(self, name: str, index: int | None = None) -> None:
        with self._lock:
            self.calls[(name, index)] += 1
        if self._init_count == 0:
            raise nvml_error(pynvml.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, name: str, handle: Any) -> FakeGpu:
        index: int = self._handles.lookup(handle)
        self._enter(name, index)
        gpu = self.gpus[index]
        if gpu.lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if name in gpu.fail:
            raise nvml_error(gpu.fail[name])
        if name in gpu.unsupported:
            raise nvml_error(NOT_SUPPORTED)
        return self.gpus[index]

    # -- library and system ------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls[("nvmlInit", None)] += 1
        if self.library_missing:
            raise nvml_error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        self._init_count += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self._init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._enter("nvmlDeviceGetHandleByIndex", index)
        if not 0 <= index < len(self.gpus):
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            raise nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)
        return self._handle_of[index]

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        self._gpu("nvmlDeviceGetIndex", handle)
        return int(self._handles.lookup(handle))

    # -- identity ------------------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        return self._gpu("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        gpu = self._gpu("nvmlDeviceGetPciInfo", handle)
        info = pynvml.nvmlPciInfo_t()
        info.busId = gpu.pci_bus_id.encode()
        info.busIdLegacy = gpu.pci_bus_id.encode()
        return info

    # -- clocks, throttling, power, thermals, utilisation, memory ------------------------------

    def nvmlDeviceGetClockInfo(self, handle: Any, type: int) -> int:
        gpu = self._gpu("nvmlDeviceGetClockInfo", handle)
        if type == pynvml.NVML_CLOCK_SM:
            return int(_v(gpu.sm_clock_mhz))
        if type == pynvml.NVML_CLOCK_MEM:
            return int(_v(gpu.mem_clock_mhz))
        raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, type: int) -> int:
        gpu = self._gpu("nvmlDeviceGetMaxClockInfo", handle)
        if type != pynvml.NVML_CLOCK_SM:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(_v(gpu.sm_clock_max_mhz))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        return int(
            _v(self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle).clocks_event_reasons)
        )

    def nvmlDeviceGetViolationStatus(self, device: Any, perfPolicyType: int) -> Any:
        gpu = self._gpu("nvmlDeviceGetViolationStatus", device)
        reason = {
            pynvml.NVML_PERF_POLICY_POWER: "sw_power_cap",
            pynvml.NVML_PERF_POLICY_THERMAL: "sw_thermal",
        }
        if perfPolicyType not in reason:
            raise nvml_error(NOT_SUPPORTED)
        out = pynvml.c_nvmlViolationTime_t()
        out.referenceTime = time.time_ns() // 1000
        out.violationTime = int(_v(gpu.throttle_ns[reason[perfPolicyType]]))
        return out

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return int(_v(self._gpu("nvmlDeviceGetPowerUsage", handle).power_mw))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        return int(_v(self._gpu("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw))

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        return int(_v(self._gpu("nvmlDeviceGetTotalEnergyConsumption", handle).energy_mj))

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._gpu("nvmlDeviceGetTemperature", handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return int(_v(gpu.temperature_c))

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        util = pynvml.c_nvmlUtilization_t()
        util.gpu, util.memory = int(_v(gpu.gpu_util_pct)), int(_v(gpu.mem_util_pct))
        return util

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: Any = None) -> Any:
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        mem = pynvml.c_nvmlMemory_t()
        mem.total, mem.used = int(_v(gpu.memory_total_bytes)), int(_v(gpu.memory_used_bytes))
        mem.free = mem.total - mem.used
        return mem

    def nvmlDeviceGetFieldValues(self, handle: Any, fieldIds: list[Any]) -> Any:
        gpu = self._gpu("nvmlDeviceGetFieldValues", handle)
        by_id: dict[int, tuple[int, Callable[[], Any]]] = {}
        for name, spec in gpu.field_table().items():
            fid = getattr(pynvml, name, None)
            if fid is not None and (gpu.fields_supported is None or name in gpu.fields_supported):
                by_id[fid] = spec
        values = (pynvml.c_nvmlFieldValue_t * len(fieldIds))()
        for slot, fid in zip(values, fieldIds, strict=True):
            slot.fieldId = fid
            slot.timestamp = time.time_ns() // 1000
            if fid not in by_id:
                slot.nvmlReturn = NOT_SUPPORTED
                continue
            value_type, reader = by_id[fid]
            slot.nvmlReturn = pynvml.NVML_SUCCESS
            slot.valueType = value_type
            if value_type == UINT:
                slot.value.uiVal = int(_v(reader()))
            else:
                slot.value.ullVal = int(_v(reader()))
        return values

    # -- errors and links ----------------------------------------------------------------------

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        gpu = self._gpu("nvmlDeviceGetTotalEccErrors", handle)
        return int(_v(gpu.ecc.get((errorType, counterType), 0)))

    def nvmlDeviceGetRemappedRows(self, device: Any) -> tuple[int, int, int, int]:
        corr, unc, pending, failed = _v(
            self._gpu("nvmlDeviceGetRemappedRows", device).remapped_rows
        )
        return int(corr), int(unc), int(pending), int(failed)

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return int(_v(self._gpu("nvmlDeviceGetPcieReplayCounter", handle).pcie_replay_count))

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        return int(_v(self._gpu("nvmlDeviceGetCurrPcieLinkWidth", handle).pcie_link_width))

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        return int(_v(self._gpu("nvmlDeviceGetMaxPcieLinkWidth", handle).pcie_link_width_max))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        return int(_v(self._gpu("nvmlDeviceGetCurrPcieLinkGeneration", handle).pcie_link_gen))

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        return int(_v(self._gpu("nvmlDeviceGetMaxPcieLinkGeneration", handle).pcie_link_gen_max))

    def _link(self, name: str, device: Any, link: int) -> FakeGpu:
        gpu = self._gpu(name, device)
        if gpu.nvlink_links == 0:
            raise nvml_error(NOT_SUPPORTED)
        if not 0 <= link < gpu.nvlink_links:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return gpu

    def nvmlDeviceGetNvLinkState(self, device: Any, link: int) -> int:
        self._link("nvmlDeviceGetNvLinkState", device, link)
        return int(pynvml.NVML_FEATURE_ENABLED)

    def nvmlDeviceGetNvLinkErrorCounter(self, device: Any, link: int, counter: int) -> int:
        gpu = self._link("nvmlDeviceGetNvLinkErrorCounter", device, link)
        return int(_v(gpu.nvlink_errors.get((link, counter), 0)))

    # -- GPM -----------------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, device: Any) -> Any:
        gpu = self._gpu("nvmlGpmQueryDeviceSupport", device)
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(gpu.gpm_supported)
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        return self._gpm.new(_GpmSample())

    def nvmlGpmSampleFree(self, gpmSample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        self._gpm.free(gpmSample)

    def nvmlGpmSampleGet(self, device: Any, gpmSample: Any) -> Any:
        gpu = self._gpu("nvmlGpmSampleGet", device)
        if not gpu.gpm_supported:
            raise nvml_error(NOT_SUPPORTED)
        sample = self._gpm.lookup(gpmSample)
        sample.gpu = self._handles.lookup(device)
        sample.sm_active_pct = float(_v(gpu.sm_active_pct))
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        if metricsGet.version != pynvml.NVML_GPM_METRICS_GET_VERSION:
            raise nvml_error(pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        first, second = self._gpm.lookup(metricsGet.sample1), self._gpm.lookup(metricsGet.sample2)
        if first.gpu is None or first.gpu != second.gpu:
            raise nvml_error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        for i in range(metricsGet.numMetrics):
            metric = metricsGet.metrics[i]
            if metric.metricId == pynvml.NVML_GPM_METRIC_SM_UTIL:
                metric.nvmlReturn, metric.value = pynvml.NVML_SUCCESS, second.sm_active_pct
            else:
                metric.nvmlReturn = NOT_SUPPORTED
        return metricsGet

    # -- events --------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> Any:
        self._enter("nvmlEventSetCreate")
        with self._lock:
            return self._sets.new(_EventSet())

    def nvmlEventSetFree(self, eventSet: Any) -> None:
        self._enter("nvmlEventSetFree")
        with self._lock:
            self._sets.free(eventSet)

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        return int(self._gpu("nvmlDeviceGetSupportedEventTypes", handle).supported_events)

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: Any) -> None:
        gpu = self._gpu("nvmlDeviceRegisterEvents", handle)
        if eventTypes & ~gpu.supported_events:
            raise nvml_error(NOT_SUPPORTED)
        with self._lock:
            es = self._sets.lookup(eventSet)
            index = self._handles.lookup(handle)
            es.registered[index] = es.registered.get(index, 0) | eventTypes

    def nvmlEventSetWait_v2(self, eventSet: Any, timeoutms: int) -> Any:
        self._enter("nvmlEventSetWait_v2")
        with self._events:
            es = self._sets.lookup(eventSet)
            if not self._events.wait_for(lambda: bool(es.queue), timeout=timeoutms / 1000):
                raise nvml_error(pynvml.NVML_ERROR_TIMEOUT)
            index, event_type, event_data = es.queue.popleft()
        data = pynvml.c_nvmlEventData_t()
        data.device = self._handle_of[index]
        data.eventType, data.eventData = event_type, event_data
        data.gpuInstanceId = data.computeInstanceId = 0xFFFFFFFF  # not a MIG instance
        return data


class FakeClock:
    """A settable :class:`peerwatch.clock.Clock`: ``ms`` is the time, in ms since the epoch.

    ``step_ms`` is added after every ``now_ms()`` read. ``monotonic_s()`` reads the same time in
    seconds without stepping (the fake wall clock never jumps, so it serves as both).
    """

    def __init__(self, start_ms: int = 1_700_000_000_000, step_ms: int = 0) -> None:
        self.ms = start_ms
        self.step_ms = step_ms
        self._lock = threading.Lock()

    def now_ms(self) -> int:
        with self._lock:
            now = self.ms
            self.ms += self.step_ms
            return now

    def monotonic_s(self) -> float:
        with self._lock:
            return self.ms / 1000
