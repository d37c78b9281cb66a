"""The agent against what a real GPU answered: an NVIDIA H200 recorded through NVML
(``tests/data/nvml/h200``, made by ``scripts/record_nvml.py``; idle, then a bf16 matrix-product
load that ran into the 700 W power cap, then idle again).

- The sampler, given the recorded answers, makes exactly the records the agent made there.
- Those records fit the NodeGpuSample schema, and the whole pipeline finds nothing in them (an
  idle, busy and power-capped healthy GPU is no fault).
- The test double (``FakeGpu.h200``) answers as that GPU did: same read plan, same nulls, same
  field value types.
- The prolog health checks, recorded on the same GPU, give the same verdicts from its answers.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pynvml
import pytest
from fakes import FakeClock, FakeGpu, FakeNvml

from peerwatch.producers.health.run import HealthDeps, HealthSettings, run_health
from peerwatch.producers.nvml.sampler import GpuSampler
from peerwatch.producers.nvml.trace import ReplayNvml, load_trace
from peerwatch.producers.nvml.xid import XidWatcher
from peerwatch.schemas.codec import AvroCodec
from peerwatch.settings import Settings
from peerwatch.streams.core.pipeline import FINDING, RECOMMENDATION, Pipeline

DATA = Path(__file__).parents[1] / "data" / "nvml" / "h200"
POWER_CAP = pynvml.nvmlClocksEventReasonSwPowerCap


@pytest.fixture(scope="module")
def trace() -> dict[str, Any]:
    return load_trace(DATA / "trace.json")


@pytest.fixture(scope="module")
def records() -> list[dict[str, Any]]:
    return [json.loads(line) for line in (DATA / "records.jsonl").read_text().splitlines()]


class _Times:
    """A clock that reads the recorded sample times, in order."""

    def __init__(self, times_ms: list[int]) -> None:
        self._times = list(times_ms)

    def now_ms(self) -> int:
        return self._times.pop(0)

    def monotonic_s(self) -> float:
        return 0.0


def _replayed(trace: dict[str, Any], records: list[dict[str, Any]]) -> tuple[list[Any], ReplayNvml]:
    nvml = ReplayNvml(trace)
    nvml.nvmlInit()
    first = records[0]
    sampler = GpuSampler(nvml, first["node"], first["interval_ms"],
                         _Times([r["ts_ms"] for r in records]),
                         agent_run_id=first["agent_run_id"])  # fmt: skip
    # The agent ran its XID watcher beside the sampler, on the same NVML: replay it too.
    watcher = XidWatcher(nvml, lambda _e: None, FakeClock(), wait_timeout_ms=1)
    assert watcher.start() == [0]
    out = [sampler.sample(r["seq"], r["xids"]) for r in records]
    sampler.close()
    watcher.stop()
    nvml.nvmlShutdown()
    return out, nvml


def test_the_recording_is_of_an_h200_idle_then_power_capped(records: list[dict[str, Any]]) -> None:
    gpus = [r["gpus"][0] for r in records]
    assert {g["name"] for g in gpus} == {"NVIDIA H200"} and {g["state"] for g in gpus} == {"OK"}
    busy = [g for g in gpus if g["sm_active_pct"] > 90.0]  # whole seconds of the load
    assert len(busy) >= 5 and gpus[0]["gpu_util_pct"] == gpus[-1]["gpu_util_pct"] == 0
    for g in busy:  # at the power cap: the SW power cap reason, clocks below their maximum
        assert g["clocks_event_reasons"] & POWER_CAP and g["gpu_util_pct"] >= 99
        assert g["power_mw"] > 0.95 * g["power_limit_mw"]
        assert g["sm_clock_mhz"] < g["sm_clock_max_mhz"]
    capped = [g["throttle_sw_power_cap_ns"] for g in busy]
    assert capped == sorted(capped) and capped[-1] > capped[0]  # the counter runs under the cap


def test_the_sampler_makes_the_recorded_records_from_the_recorded_answers(
    trace: dict[str, Any], records: list[dict[str, Any]]
) -> None:
    out, nvml = _replayed(trace, records)
    assert out == records
    assert nvml.remaining() == {}  # the agent asked NVML what it asked there, no more, no less


def test_the_recorded_records_fit_the_schema(records: list[dict[str, Any]]) -> None:
    codec = AvroCodec("NodeGpuSample")
    for record in records:
        # as written; SM activity (a double from NVML) travels as an Avro float
        sent = json.loads(json.dumps(record))
        for g in sent["gpus"]:
            g["sm_active_pct"] = struct.unpack("<f", struct.pack("<f", g["sm_active_pct"]))[0]
        assert codec.decode(codec.encode(record)) == sent


def test_the_pipeline_finds_nothing_in_a_healthy_gpu(records: list[dict[str, Any]]) -> None:
    node, start = records[0]["node"], records[0]["ts_ms"]
    job = {
        "event_id": "ev-1", "job_id": "1", "kind": "STARTED", "ts_ms": start - 5_000,
        "source": "WATCHER", "state": "RUNNING", "exit_code": None, "user": "u",
        "partition": "gpu", "account": "a", "job_name": "bench",
        "allocations": [{"node": node, "gpu_indices": [0]}],
        "start_ms": start - 5_000, "end_ms": None, "restart_count": 0,
    }  # fmt: skip
    for allocated in (True, False):  # owned by a job, and idle
        feed = [("job-events", "1", job)] if allocated else []
        feed += [("samples", node, r) for r in records]
        outs = list(Pipeline(Settings()).run(feed))
        assert [o.value for o in outs if o.kind in (FINDING, RECOMMENDATION)] == []


def _plan(nvml: Any) -> list[tuple[Any, ...]]:
    nvml.nvmlInit()
    sampler = GpuSampler(nvml, "n", 1000, FakeClock(), agent_run_id="r")
    plans = [
        (sorted(p.reads), p.field_keys, sorted(p.unsupported), p.gpm is not None, p.static)
        for p in sampler.probes
    ]
    sampler.close()
    return plans


def _nulls(record: dict[str, Any]) -> list[list[str]]:
    return [sorted(k for k, v in g.items() if v is None) for g in record["gpus"]]


def test_the_fake_h200_answers_as_the_recorded_one(
    trace: dict[str, Any], records: list[dict[str, Any]]
) -> None:
    fake = FakeNvml([FakeGpu.h200(0)])
    replay = ReplayNvml(trace)
    real_plan = _plan(replay)
    assert _plan(fake) == real_plan
    sampler = GpuSampler(fake, "n", 1000, FakeClock(), agent_run_id="r")
    assert _nulls(sampler.sample(0)) == _nulls(records[0])
    # field values: each supported id answers with the value type the GPU used
    real = next(c for c in trace["calls"] if c["fn"] == "nvmlDeviceGetFieldValues")
    ids = real["args"][1]["list"]
    got = fake.nvmlDeviceGetFieldValues(fake.nvmlDeviceGetHandleByIndex(0), ids)
    answered = [(v["fields"]["fieldId"], v["fields"]["nvmlReturn"], v["fields"]["valueType"])
                for v in real["result"]["list"]]  # fmt: skip
    assert [(int(v.fieldId), int(v.nvmlReturn), int(v.valueType)) for v in got] == answered


def test_the_prolog_checks_pass_the_recorded_gpu_again(tmp_path: Path) -> None:
    """The health checks over the recorded answers of the same H200: the same verdicts (the
    InfiniBand check reads this machine's sysfs, so it is pointed at an empty folder)."""
    recorded = json.loads((DATA / "health-result.json").read_text())
    nvml = ReplayNvml(load_trace(DATA / "health-trace.json"))
    settings = HealthSettings(ib_sysfs_root=tmp_path)
    result, code = run_health("PROLOG", node=recorded["node"], settings=settings,
                              deps=HealthDeps(nvml=nvml, which=lambda _n: None))  # fmt: skip
    assert (code, result["status"]) == (0, recorded["status"]) == (0, "OK")
    gpu = [c for c in recorded["checks"] if c["name"] != "ib_port"]
    assert [c for c in result["checks"] if c["name"] != "ib_port"] == gpu
    assert {c["name"] for c in gpu} >= {"gpu_count", "ecc_uncorrected", "remap", "pcie_width"}
    assert nvml.remaining() == {}
