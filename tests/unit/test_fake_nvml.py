"""FakeNvml behaves like the real binding where the code under test can tell."""

from __future__ import annotations

import ctypes
import inspect
import time

import pynvml
import pytest
from fakes import FakeGpu, FakeNvml

from peerwatch.producers.nvml.device import NvmlApi, NvmlUnavailableError, init_nvml, load_nvml


def _protocol_methods() -> list[str]:
    return sorted(
        name
        for name, member in vars(NvmlApi).items()
        if name.startswith("nvml") and callable(member)
    )


def _params(fn: object) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]  # type: ignore[arg-type]


@pytest.fixture
def nvml() -> FakeNvml:
    fake = FakeNvml([FakeGpu.h100(0), FakeGpu.h100(1)])
    fake.nvmlInit()
    return fake


@pytest.mark.parametrize("name", _protocol_methods())
def test_protocol_real_and_fake_share_names_and_parameters(name: str) -> None:
    expected = _params(getattr(NvmlApi, name))
    assert _params(getattr(pynvml, name)) == expected
    assert _params(getattr(FakeNvml, name)) == expected


def test_calls_before_init_raise_uninitialized() -> None:
    fake = FakeNvml([FakeGpu.h100()])
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()


def test_missing_library_raises_library_not_found_and_init_nvml_explains() -> None:
    fake = FakeNvml([FakeGpu.h100()], library_missing=True)
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        fake.nvmlInit()
    with pytest.raises(NvmlUnavailableError, match=r"libnvidia-ml\.so\.1 not found") as info:
        init_nvml(fake)
    assert info.value.nvml_code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    assert isinstance(info.value.__cause__, pynvml.NVMLError_LibraryNotFound)


def test_errors_are_the_bindings_classes(nvml: FakeNvml) -> None:
    nvml.gpus[0].unsupported.add("nvmlDeviceGetPowerUsage")
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported) as info:
        nvml.nvmlDeviceGetPowerUsage(h)
    assert info.value == pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
    assert str(info.value) == "Not Supported"


def test_handles_are_opaque_device_pointers(nvml: FakeNvml) -> None:
    h0, h0_again = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlDeviceGetHandleByIndex(0)
    assert isinstance(h0, pynvml.c_nvmlDevice_t)
    assert nvml.nvmlDeviceGetIndex(h0_again) == 0
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetPowerUsage(object())


def test_structs_are_pynvml_structs(nvml: FakeNvml) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    assert isinstance(nvml.nvmlDeviceGetUtilizationRates(h), pynvml.c_nvmlUtilization_t)
    mem = nvml.nvmlDeviceGetMemoryInfo(h)
    assert mem.total == mem.used + mem.free
    # pynvml structs hand char arrays back as str
    assert nvml.nvmlDeviceGetPciInfo(h).busId == "00000000:28:00.0"


def test_field_values_per_field_return_codes(nvml: FakeNvml) -> None:
    gpu = nvml.gpus[0]
    gpu.fields_supported = {"NVML_FI_DEV_MEMORY_TEMP"}
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    values = nvml.nvmlDeviceGetFieldValues(
        h, [pynvml.NVML_FI_DEV_MEMORY_TEMP, pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL]
    )
    assert isinstance(values[0], pynvml.c_nvmlFieldValue_t)
    assert values[0].fieldId == pynvml.NVML_FI_DEV_MEMORY_TEMP
    assert values[0].nvmlReturn == pynvml.NVML_SUCCESS
    assert values[0].valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    assert values[0].value.uiVal == 62
    assert values[1].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_lost_gpu_fails_every_later_call(nvml: FakeNvml) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    nvml.lose_gpu(1, xid=None)
    for call in (
        lambda: nvml.nvmlDeviceGetPowerUsage(h),
        lambda: nvml.nvmlDeviceGetUUID(h),
        lambda: nvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_MEMORY_TEMP]),
        lambda: nvml.nvmlDeviceGetHandleByIndex(1),
    ):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call()
    assert nvml.nvmlDeviceGetPowerUsage(nvml.nvmlDeviceGetHandleByIndex(0)) == 650_000


def test_event_wait_times_out_when_idle_then_returns_event_data(nvml: FakeNvml) -> None:
    es = nvml.nvmlEventSetCreate()
    h = nvml.nvmlDeviceGetHandleByIndex(1)
    nvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
    t0 = time.monotonic()
    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait_v2(es, 50)
    assert 0.04 <= time.monotonic() - t0 < 1.0
    nvml.inject_xid(1, 48)
    nvml.inject_xid(0, 13)  # GPU 0 is not registered: not delivered
    data = nvml.nvmlEventSetWait_v2(es, 50)
    assert isinstance(data, pynvml.c_nvmlEventData_t)
    assert (data.eventType, data.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 48)
    assert ctypes.cast(data.device, ctypes.c_void_p).value == ctypes.cast(h, ctypes.c_void_p).value
    assert hasattr(data, "gpuInstanceId") and hasattr(data, "computeInstanceId")
    with pytest.raises(pynvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait_v2(es, 10)
    nvml.nvmlEventSetFree(es)


def test_gpm_metrics_with_the_bindings_struct(nvml: FakeNvml) -> None:
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    s1, s2 = nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()
    nvml.nvmlGpmSampleGet(h, s1)
    nvml.gpus[0].sm_active_pct = 42.0
    nvml.nvmlGpmSampleGet(h, s2)
    mg = pynvml.c_nvmlGpmMetricsGet_t()
    mg.version, mg.numMetrics = pynvml.NVML_GPM_METRICS_GET_VERSION, 1
    mg.sample1, mg.sample2 = s1, s2
    mg.metrics[0].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
    nvml.nvmlGpmMetricsGet(mg)
    assert mg.metrics[0].nvmlReturn == pynvml.NVML_SUCCESS
    assert mg.metrics[0].value == pytest.approx(42.0)
    nvml.nvmlGpmSampleFree(s1)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlGpmMetricsGet(mg)


def test_constants_forwarded_hidden_names_and_functions_not(nvml: FakeNvml) -> None:
    assert nvml.NVML_FI_DEV_MEMORY_TEMP == pynvml.NVML_FI_DEV_MEMORY_TEMP
    old = FakeNvml([], hidden_names={"NVML_FI_DEV_MEMORY_TEMP"})
    assert getattr(old, "NVML_FI_DEV_MEMORY_TEMP", None) is None
    with pytest.raises(AttributeError):
        _ = nvml.nvmlDeviceGetBAR1MemoryInfo  # not implemented: must not fall through to pynvml


def test_advance_grows_energy_and_active_throttle_counters(nvml: FakeNvml) -> None:
    gpu = nvml.gpus[0]
    gpu.clocks_event_reasons = pynvml.nvmlClocksEventReasonHwThermalSlowdown
    before = gpu.energy_mj
    nvml.advance(2000)
    assert gpu.energy_mj - before == 650_000 * 2000 // 1000  # mW * ms / 1000 = mJ
    assert gpu.throttle_ns["hw_thermal"] == 2_000_000_000
    assert gpu.throttle_ns["sw_power_cap"] == 0


def test_real_binding_without_a_driver_gives_a_clear_error() -> None:
    real = load_nvml()
    try:
        init_nvml(real)
    except NvmlUnavailableError as exc:
        assert exc.nvml_code in (
            pynvml.NVML_ERROR_LIBRARY_NOT_FOUND,
            pynvml.NVML_ERROR_DRIVER_NOT_LOADED,
        )
        return
    real.nvmlShutdown()
    pytest.skip("this machine has a working NVIDIA driver")
