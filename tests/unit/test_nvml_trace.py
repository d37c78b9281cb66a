"""NVML traces: a run recorded through RecordingNvml and played back by ReplayNvml gives the
sampler the same answers (values, structs, NVML errors, a lost GPU), so the same records."""

from __future__ import annotations

import json
import queue
from typing import Any

import pynvml
import pytest
from fakes import FakeClock, FakeGpu, FakeNvml

from peerwatch.producers.nvml.sampler import GpuSampler
from peerwatch.producers.nvml.trace import (
    RecordingNvml,
    ReplayNvml,
    TraceMismatch,
    field_id_names,
)
from peerwatch.producers.nvml.xid import XidWatcher


def _fleet() -> FakeNvml:
    """Two H100s (one loses its memory temperature and GPM), one A100 whose ECC calls fail."""
    gpus = [
        FakeGpu.h100(0),
        FakeGpu.h100(1, unsupported={"nvmlDeviceGetTemperature"}, gpm_supported=False),
        FakeGpu.a100(2, fail={"nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_UNKNOWN}),
    ]
    return FakeNvml(gpus)


def _run(nvml: Any, ticks: int, lose_at: int | None = None, fake: FakeNvml | None = None
         ) -> list[dict[str, Any]]:  # fmt: skip
    sampler = GpuSampler(nvml, "node-a", 1000, FakeClock(1_700_000_000_000, step_ms=1000),
                         agent_run_id="run")  # fmt: skip
    records = []
    for seq in range(ticks):
        if fake is not None:
            fake.advance(1000)
            if seq == lose_at:
                fake.lose_gpu(1, xid=None)
        records.append(sampler.sample(seq))
    sampler.close()
    return records


def _recorded(ticks: int = 4, lose_at: int | None = 2) -> tuple[dict[str, Any], list[Any]]:
    fake = _fleet()
    recording = RecordingNvml(fake)
    recording.nvmlInit()
    records = _run(recording, ticks, lose_at, fake)
    recording.nvmlShutdown()
    # through JSON, as the fixture files are kept
    return json.loads(json.dumps(recording.trace(node="node-a"))), records


def test_replay_gives_the_recorded_records_errors_and_lost_gpu_included() -> None:
    trace, records = _recorded()
    assert records[3]["gpus"][1]["state"] == "LOST"  # the run did meet the lost GPU
    assert records[0]["gpus"][2]["state"] == "ERROR"  # and the failing power read
    assert records[0]["gpus"][0]["sm_active_pct"] is not None  # GPM, through the filled struct
    assert any("error" in c for c in trace["calls"])
    replay = ReplayNvml(trace)
    replay.nvmlInit()
    assert _run(replay, 4) == records
    replay.nvmlShutdown()
    assert replay.remaining() == {}  # every recorded answer was asked for, none twice


def test_replay_offers_the_field_ids_the_recording_binding_had() -> None:
    fake = FakeNvml([FakeGpu.h100(0)], hidden_names={"NVML_FI_DEV_PCIE_REPLAY_COUNTER"})
    trace = RecordingNvml(fake).trace()
    assert "NVML_FI_DEV_PCIE_REPLAY_COUNTER" not in trace["field_ids"]
    assert set(trace["field_ids"]) <= set(field_id_names())
    replay = ReplayNvml(trace)
    assert not hasattr(replay, "NVML_FI_DEV_PCIE_REPLAY_COUNTER")
    name = next(iter(trace["field_ids"]))
    assert getattr(replay, name) == trace["field_ids"][name]
    assert replay.NVML_CLOCK_SM == pynvml.NVML_CLOCK_SM  # other constants: the binding's


def test_a_call_the_trace_does_not_hold_is_a_mismatch() -> None:
    trace, _ = _recorded(ticks=1, lose_at=None)
    replay = ReplayNvml(trace)
    with pytest.raises(TraceMismatch, match="nvmlDeviceGetHandleByIndex"):
        replay.nvmlDeviceGetHandleByIndex(7)
    handle = replay.nvmlDeviceGetHandleByIndex(0)
    replay.nvmlDeviceGetUUID(handle)
    with pytest.raises(TraceMismatch, match="nvmlDeviceGetUUID"):  # asked once, answered once
        replay.nvmlDeviceGetUUID(handle)


def test_recorded_xid_reaches_the_watcher_on_replay() -> None:
    fake = FakeNvml([FakeGpu.h100(0), FakeGpu.h100(1)])
    fake.nvmlInit()
    recording = RecordingNvml(fake)
    got: queue.Queue[dict[str, Any]] = queue.Queue()
    watcher = XidWatcher(recording, got.put, FakeClock(1_700_000_000_000), wait_timeout_ms=20)
    assert watcher.start() == [0, 1]
    fake.inject_xid(1, 79)
    assert got.get(timeout=5)["gpu_index"] == 1
    watcher.stop()
    trace = json.loads(json.dumps(recording.trace()))
    waits = [c for c in trace["calls"] if c["fn"] == "nvmlEventSetWait_v2"]
    assert any(c.get("error") == pynvml.NVML_ERROR_TIMEOUT for c in waits)
    assert [c["result"]["fields"]["device"] for c in waits if "result" in c] == [{"gpu": 1}]

    replayed: queue.Queue[dict[str, Any]] = queue.Queue()
    again = XidWatcher(ReplayNvml(trace), replayed.put, FakeClock(5), wait_timeout_ms=20)
    assert again.start() == [0, 1]
    event = replayed.get(timeout=5)  # the recorded XID; then the waits time out, as when idle
    again.stop()
    assert (event["gpu_index"], event["xid"]) == (1, 79)


@pytest.mark.parametrize(
    ("trace", "message"),
    [
        ({"format": 99, "calls": []}, "format 99"),
        ({"format": 1}, "no list of calls"),
        ({"format": 1, "calls": [{"fn": "nvmlInit"}]}, "call 0 lacks"),
        ({"format": 1, "calls": [{"args": [], "fn": 7}]}, "call 0 lacks"),
    ],
)
def test_a_malformed_trace_is_refused_with_the_reason(trace: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReplayNvml(trace)
