"""GpuSampler: every NodeGpuSample field from the fake, valid Avro, LOST/ERROR handling."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pynvml
import pytest
from fakes import FakeClock, FakeGpu, FakeNvml
from fastavro import parse_schema
from fastavro.validation import validate

from peerwatch.producers.nvml.sampler import QUANTITY_FIELDS, GpuSampler

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "NodeGpuSample.avsc"
SCHEMA = json.loads(SCHEMA_PATH.read_text())
PARSED = parse_schema(SCHEMA)
READING_FIELDS = [f["name"] for f in SCHEMA["fields"][6]["type"]["items"]["fields"]]


def _valid(record: dict[str, Any]) -> bool:
    return bool(validate(record, PARSED, raise_errors=True))


@pytest.fixture
def nvml() -> FakeNvml:
    fake = FakeNvml([FakeGpu.h100(i) for i in range(4)])
    fake.nvmlInit()
    return fake


@pytest.fixture
def sampler(nvml: FakeNvml) -> GpuSampler:
    return GpuSampler(nvml, "gpu-a01", 2000, FakeClock(1_700_000_000_000), agent_run_id="run-1")


def test_quantity_list_matches_the_schema() -> None:
    identity = ["index", "uuid", "state", "error", "name", "pci_bus_id"]
    assert SCHEMA["fields"][6]["name"] == "gpus"
    assert list(QUANTITY_FIELDS) == READING_FIELDS[len(identity) :]
    assert READING_FIELDS[: len(identity)] == identity


def test_every_field_filled_and_valid_avro(nvml: FakeNvml, sampler: GpuSampler) -> None:
    record = sampler.sample(7)
    assert _valid(record)
    assert {k: record[k] for k in ("node", "ts_ms", "seq", "agent_run_id", "interval_ms")} == {
        "node": "gpu-a01",
        "ts_ms": 1_700_000_000_000,
        "seq": 7,
        "agent_run_id": "run-1",
        "interval_ms": 2000,
    }
    assert record["driver_version"] == "550.90.07"
    assert record["xids"] == []
    assert [g["index"] for g in record["gpus"]] == [0, 1, 2, 3]
    gpu = record["gpus"][2]
    # The binding has no hardware-slowdown counter field; every other field has a value.
    nulls = {k for k, v in gpu.items() if v is None}
    assert nulls == {"error", "throttle_hw_slowdown_ns"}
    assert gpu["state"] == "OK"
    assert gpu["uuid"] == nvml.gpus[2].uuid and gpu["pci_bus_id"] == "00000000:38:00.0"


def test_units_are_passed_through_as_nvml_gives_them(nvml: FakeNvml, sampler: GpuSampler) -> None:
    g = nvml.gpus[0]
    g.power_mw, g.power_limit_mw, g.energy_mj = 612_345, 700_000, 9_876_543_210
    g.memory_used_bytes, g.temperature_c, g.sm_clock_mhz = 1 << 35, 71, 1755
    g.remapped_rows = (3, 1, 0, 0)
    g.pcie_link_width, g.pcie_link_gen = 8, 4
    g.clocks_event_reasons = pynvml.nvmlClocksEventReasonSwPowerCap
    r = sampler.sample(0)["gpus"][0]
    assert (r["power_mw"], r["power_limit_mw"], r["energy_mj"]) == (612_345, 700_000, 9_876_543_210)
    assert (r["memory_used_bytes"], r["temperature_c"], r["sm_clock_mhz"]) == (1 << 35, 71, 1755)
    assert (r["remapped_rows_correctable"], r["remapped_rows_uncorrectable"]) == (3, 1)
    assert (r["remap_pending"], r["remap_failed"]) == (False, False)
    assert (r["pcie_link_width"], r["pcie_link_width_max"], r["pcie_link_gen"]) == (8, 16, 4)
    assert r["clocks_event_reasons"] == 0x4


def test_counters_move_between_ticks(nvml: FakeNvml, sampler: GpuSampler) -> None:
    g = nvml.gpus[1]
    g.clocks_event_reasons = (
        pynvml.nvmlClocksEventReasonHwThermalSlowdown | pynvml.nvmlClocksEventReasonSwPowerCap
    )
    first = sampler.sample(0)["gpus"][1]
    nvml.advance(1500)
    g.ecc[(pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC)] = 4
    g.remapped_rows = (0, 0, 1, 0)
    g.recovery_action = 1
    second = sampler.sample(1)["gpus"][1]
    assert second["throttle_hw_thermal_ns"] - first["throttle_hw_thermal_ns"] == 1_500_000_000
    assert second["throttle_sw_power_cap_ns"] - first["throttle_sw_power_cap_ns"] == 1_500_000_000
    assert second["throttle_sw_thermal_ns"] == first["throttle_sw_thermal_ns"] == 0
    assert second["energy_mj"] - first["energy_mj"] == 650_000 * 1500 // 1000
    assert second["ecc_volatile_corrected"] == 4
    assert second["remap_pending"] is True
    assert second["recovery_action"] == 1


def test_nvlink_counters_summed_over_links(nvml: FakeNvml, sampler: GpuSampler) -> None:
    g = nvml.gpus[3]
    g.nvlink_errors.update(
        {
            (0, pynvml.NVML_NVLINK_ERROR_DL_REPLAY): 2,
            (11, pynvml.NVML_NVLINK_ERROR_DL_REPLAY): 3,
            (4, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY): 1,
            (1, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT): 10,
            (2, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA): 5,
        }
    )
    r = sampler.sample(0)["gpus"][3]
    assert (r["nvlink_replay_errors"], r["nvlink_recovery_errors"], r["nvlink_crc_errors"]) == (
        5,
        1,
        15,
    )


def test_one_field_value_call_per_gpu_per_tick(nvml: FakeNvml, sampler: GpuSampler) -> None:
    sampler.probe()
    before = nvml.count("nvmlDeviceGetFieldValues")
    for seq in range(3):
        sampler.sample(seq)
    assert nvml.count("nvmlDeviceGetFieldValues") - before == 3 * 4
    assert nvml.count("nvmlDeviceGetTotalEccErrors") == 0  # ECC came from the batch


def test_energy_read_once_per_energy_interval(nvml: FakeNvml) -> None:
    """``energy_interval_ms``: the energy counter (NVML's costliest read) is read in the first
    sample of each interval of the wall-clock grid; the other quantities every sample."""
    clock = FakeClock(1_700_000_001_000, step_ms=1000)  # 1 s after a 10 s grid point
    sampler = GpuSampler(nvml, "gpu-a01", 1000, clock, agent_run_id="r", energy_interval_ms=10_000)
    sampler.probe()  # reads each quantity once
    probed = nvml.count("nvmlDeviceGetTotalEnergyConsumption")
    records = [sampler.sample(seq) for seq in range(25)]
    read = [r["seq"] for r in records if r["gpus"][0]["energy_mj"] is not None]
    assert read == [0, 9, 19]  # at +1 s (the first sample), then at +10 s and +20 s
    assert nvml.count("nvmlDeviceGetTotalEnergyConsumption") - probed == 3 * 4
    assert all(r["gpus"][0]["power_mw"] is not None for r in records)
    assert all(_valid(r) for r in records)
    with pytest.raises(ValueError, match="energy_interval_ms"):
        GpuSampler(nvml, "n", 1000, clock, energy_interval_ms=0)


def test_gpm_sm_activity_between_consecutive_ticks(nvml: FakeNvml, sampler: GpuSampler) -> None:
    values = iter([10.0, 55.5, 99.0, 12.0])
    nvml.gpus[0].sm_active_pct = lambda: next(values)
    seen = [sampler.sample(seq)["gpus"][0]["sm_active_pct"] for seq in range(3)]
    # The probe takes the first GPM sample (10.0); each tick reports the interval ending now.
    assert seen == [55.5, 99.0, 12.0]
    sampler.close()
    assert nvml.count("nvmlGpmSampleFree") == 2 * 4


def test_gpu_lost_mid_run_reports_lost_and_keeps_going(nvml: FakeNvml, sampler: GpuSampler) -> None:
    assert sampler.sample(0)["gpus"][1]["state"] == "OK"
    nvml.lose_gpu(1)
    record = sampler.sample(1)
    lost = record["gpus"][1]
    assert lost["state"] == "LOST" and lost["error"] == "GPU is lost"
    assert all(lost[k] is None for k in QUANTITY_FIELDS)
    assert lost["uuid"] == nvml.gpus[1].uuid  # identity from the probe stays
    assert [g["state"] for g in record["gpus"]] == ["OK", "LOST", "OK", "OK"]
    assert _valid(record)
    calls_on_lost = sum(n for (_, i), n in nvml.calls.items() if i == 1)
    third = sampler.sample(2)
    assert third["gpus"][1]["state"] == "LOST"
    assert sum(n for (_, i), n in nvml.calls.items() if i == 1) == calls_on_lost


def test_other_nvml_error_marks_error_and_keeps_other_values(
    nvml: FakeNvml, sampler: GpuSampler
) -> None:
    sampler.probe()
    nvml.gpus[2].fail["nvmlDeviceGetTotalEnergyConsumption"] = pynvml.NVML_ERROR_UNKNOWN
    record = sampler.sample(0)
    gpu = record["gpus"][2]
    assert gpu["state"] == "ERROR"
    assert gpu["error"] == "nvmlDeviceGetTotalEnergyConsumption: Unknown Error"
    assert gpu["energy_mj"] is None and gpu["power_mw"] == 650_000
    assert _valid(record)
    nvml.gpus[2].fail.clear()
    assert sampler.sample(1)["gpus"][2]["state"] == "OK"  # transient: asked again next tick


def test_unexpected_exception_is_contained_to_its_gpu(nvml: FakeNvml, sampler: GpuSampler) -> None:
    def broken() -> int:
        raise RuntimeError("boom")

    sampler.probe()
    nvml.gpus[0].power_mw = broken
    record = sampler.sample(0)
    assert record["gpus"][0]["state"] == "ERROR" and "boom" in record["gpus"][0]["error"]
    assert record["gpus"][1]["state"] == "OK"
    assert _valid(record)


def test_xids_go_into_the_record(sampler: GpuSampler) -> None:
    xid = {"gpu_index": 1, "xid": 79, "ts_ms": 1_700_000_000_500, "event_data": None}
    record = sampler.sample(0, xids=[xid])
    assert record["xids"] == [xid]
    assert _valid(record)


def test_sampling_before_nvml_init_raises() -> None:
    fake = FakeNvml([FakeGpu.h100()])
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        GpuSampler(fake, "n", 1000, FakeClock()).sample(0)


def test_zero_gpus_gives_a_valid_empty_record() -> None:
    fake = FakeNvml([])
    fake.nvmlInit()
    record = GpuSampler(fake, "cpu-01", 1000, FakeClock()).sample(0)
    assert record["gpus"] == [] and _valid(record)
