"""Probing: supported reads enter the plan once, unsupported ones are never called again."""

from __future__ import annotations

import pynvml
import pytest
from fakes import FakeClock, FakeGpu, FakeNvml

from peerwatch.producers.nvml.probe import probe_gpus, resolve_field_ids
from peerwatch.producers.nvml.reads import FIELD_SPECS
from peerwatch.producers.nvml.sampler import GpuSampler


def _sampler(*gpus: FakeGpu, **nvml_kwargs: object) -> tuple[FakeNvml, GpuSampler]:
    nvml = FakeNvml(gpus, **nvml_kwargs)  # type: ignore[arg-type]
    nvml.nvmlInit()
    return nvml, GpuSampler(nvml, "node1", 1000, FakeClock())


def test_field_ids_resolved_by_name_from_the_binding() -> None:
    ids = resolve_field_ids(pynvml)
    assert ids["memory_temperature_c"] == (pynvml.NVML_FI_DEV_MEMORY_TEMP,)
    assert ids["nvlink_crc_errors"] == (
        pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
        pynvml.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
    )
    # This binding has no HW_SLOWDOWN counter under any known name: the key is left out.
    assert "throttle_hw_slowdown_ns" not in ids
    assert set(ids) <= set(FIELD_SPECS)


def test_names_missing_from_an_older_binding_are_skipped() -> None:
    old = FakeNvml(
        [],
        hidden_names={
            "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION",
            "NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP",
            "NVML_FI_DEV_CLOCKS_EVENT_REASON_HW_THERM_SLOWDOWN",
        },
    )
    ids = resolve_field_ids(old)
    assert "recovery_action" not in ids
    assert "throttle_hw_thermal_ns" not in ids
    # The power-cap counter falls back to its older name (the perf-policy counter).
    assert ids["throttle_sw_power_cap_ns"] == (pynvml.NVML_FI_DEV_PERF_POLICY_POWER,)


def test_older_binding_gives_null_for_fields_it_cannot_name() -> None:
    _, sampler = _sampler(FakeGpu.h100(0), hidden_names={"NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"})
    gpu = sampler.sample(0)["gpus"][0]
    assert gpu["recovery_action"] is None
    assert gpu["memory_temperature_c"] == 62


@pytest.mark.parametrize(
    "code",
    [
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_NO_PERMISSION,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    ],
)
def test_unsupported_read_is_null_and_never_called_again(code: int) -> None:
    gpu = FakeGpu.h100(0, fail={"nvmlDeviceGetPowerUsage": code})
    nvml, sampler = _sampler(gpu, FakeGpu.h100(1))
    records = [sampler.sample(seq) for seq in range(3)]
    assert [r["gpus"][0]["power_mw"] for r in records] == [None, None, None]
    assert all(r["gpus"][0]["state"] == "OK" for r in records)
    assert [r["gpus"][1]["power_mw"] for r in records] == [650_000] * 3
    assert nvml.count("nvmlDeviceGetPowerUsage", 0) == 1  # the probe call only
    assert nvml.count("nvmlDeviceGetPowerUsage", 1) == 4  # probe + 3 ticks
    assert "nvmlDeviceGetPowerUsage" in sampler.probes[0].unsupported


def test_transient_error_at_probe_keeps_the_read() -> None:
    gpu = FakeGpu.h100(0, fail={"nvmlDeviceGetTemperature": pynvml.NVML_ERROR_UNKNOWN})
    nvml, sampler = _sampler(gpu)
    sampler.probe()
    gpu.fail.clear()
    assert sampler.sample(0)["gpus"][0]["temperature_c"] == 55
    assert nvml.count("nvmlDeviceGetTemperature") == 2


def test_static_capabilities_read_once() -> None:
    nvml, sampler = _sampler(FakeGpu.h100(0))
    for seq in range(4):
        gpu = sampler.sample(seq)["gpus"][0]
    assert gpu["sm_clock_max_mhz"] == 1980 and gpu["pcie_link_width_max"] == 16
    assert nvml.count("nvmlDeviceGetMaxClockInfo") == 1
    assert nvml.count("nvmlDeviceGetMaxPcieLinkWidth") == 1


def test_without_field_values_the_direct_calls_take_over() -> None:
    gpu = FakeGpu.h100(0, fields_supported=set())
    gpu.ecc[(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC)] = 3
    gpu.throttle_ns.update(sw_power_cap=5_000, sw_thermal=7_000, hw_thermal=9_000)
    gpu.nvlink_errors[(0, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT)] = 2
    gpu.nvlink_errors[(17, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA)] = 5
    gpu.pcie_replay_count = 11
    nvml, sampler = _sampler(gpu)
    r = sampler.sample(0)["gpus"][0]
    assert r["ecc_volatile_uncorrected"] == 3
    assert r["throttle_sw_power_cap_ns"] == 5_000  # nvmlDeviceGetViolationStatus(POWER)
    assert r["throttle_sw_thermal_ns"] == 7_000  # nvmlDeviceGetViolationStatus(THERMAL)
    assert r["throttle_hw_thermal_ns"] is None  # no fallback: the stream uses the bitmask
    assert r["clocks_event_reasons"] == 0
    assert r["nvlink_crc_errors"] == 7  # summed over links 0..17 by nvmlDeviceGetNvLinkErrorCounter
    assert r["pcie_replay_count"] == 11
    assert r["memory_temperature_c"] is None and r["recovery_action"] is None
    sampler.sample(1)
    # Nothing answered at probe time, so no field-value call is made per tick.
    assert nvml.count("nvmlDeviceGetFieldValues") == 1


def test_field_values_function_missing_entirely() -> None:
    gpu = FakeGpu.h100(0, unsupported={"nvmlDeviceGetFieldValues"})
    gpu.throttle_ns["sw_power_cap"] = 123
    nvml, sampler = _sampler(gpu)
    r = sampler.sample(0)["gpus"][0]
    assert r["throttle_sw_power_cap_ns"] == 123
    assert r["ecc_volatile_corrected"] == 0
    assert nvml.count("nvmlDeviceGetFieldValues") == 1


def test_pcie_card_without_nvlink_or_gpm() -> None:
    gpu = FakeGpu.h100(0, name="NVIDIA L4", nvlink_links=0, gpm_supported=False)
    gpu.fields_supported = {"NVML_FI_DEV_MEMORY_TEMP"}
    nvml, sampler = _sampler(gpu)
    r = sampler.sample(0)["gpus"][0]
    assert r["nvlink_replay_errors"] is None and r["nvlink_crc_errors"] is None
    assert r["sm_active_pct"] is None
    assert nvml.count("nvmlGpmSampleAlloc") == 0
    assert nvml.count("nvmlDeviceGetNvLinkState") == 1  # link 0 rejected: no more asked


def test_gpu_lost_during_probe() -> None:
    nvml = FakeNvml([FakeGpu.h100(0), FakeGpu.h100(1)])
    nvml.nvmlInit()
    nvml.lose_gpu(1, xid=None)
    probes = probe_gpus(nvml)
    assert not probes[0].lost and probes[0].reads
    assert probes[1].lost and probes[1].handle is None
