"""Detector state serialisation: every field kept, fresh values omitted, the compact job form
(parallel lists for what every GPU has, dicts only for GPUs that remember more), the per-GPU
dict form of earlier versions still read, damaged saved states refused."""

from __future__ import annotations

import json
import random
from dataclasses import asdict
from typing import Any

import pytest
from windowgen import noisy_job, run

from peerwatch.streams.core.detector_state import GpuDetectorState, JobDetectorState
from peerwatch.streams.core.model import JobContext


def _job() -> JobDetectorState:
    job = JobDetectorState(job_id="7", windows_seen=3, last_window_start_ms=90_000, anchor_ms=0,
                           max_gpus_seen=16, job_wide_start_ms=30_000, job_wide_clean=1)  # fmt: skip
    gpu = job.gpu("n1/0")
    gpu.status, gpu.episode_start_ms, gpu.history = "SUSPECT", 60_000, [1, 0, 2]
    gpu.cusum, gpu.clean_streak, gpu.since_emit = 2.5, 1, 2
    gpu.baseline_clk, gpu.hard_last_ms, gpu.last_seen_ms = [0.99, 0.98], {"xid_79": 60_000}, 90_000
    gpu.cause = "CLOCKS"
    job.gpu("n0/3").last_seen_ms = 85_000
    job.gpu("n0/4").history = [0, 0]
    return job


def test_to_dict_is_every_field_and_round_trips() -> None:
    job = _job()
    gpu = job.gpus["n1/0"]
    out = job.to_dict()
    full = asdict(job)
    assert out["gpu_keys"] == ["n0/3", "n0/4", "n1/0"]
    assert out["gpu_seen_ms"] == [85_000, None, 90_000]
    assert out["gpu_history"] == ["", "00", "102"]
    # only the GPU that remembers more than when it was seen and its history has a dict
    rest = {k: v for k, v in full["gpus"]["n1/0"].items() if k not in ("last_seen_ms", "history")}
    assert out["gpus"] == {"n1/0": rest}
    scalars = {k: v for k, v in out.items() if not k.startswith("gpu")}
    assert scalars == {k: v for k, v in full.items() if k != "gpus"}
    assert JobDetectorState.from_dict(out) == job
    assert JobDetectorState.from_dict(json.loads(json.dumps(out))) == job
    assert GpuDetectorState.from_dict(gpu.to_dict()) == gpu
    assert gpu.to_dict() == full["gpus"]["n1/0"]  # a GPU's own form: every field, by value


def test_the_per_gpu_dict_form_of_earlier_versions_still_reads() -> None:
    job = _job()
    older = {k: v for k, v in job.to_dict().items() if not k.startswith("gpu")}
    older["gpus"] = {k: g.to_dict() for k, g in sorted(job.gpus.items())}
    assert JobDetectorState.from_dict(older) == job


def test_states_of_a_detector_run_round_trip_through_json() -> None:
    rng = random.Random(4)
    offsets = [rng.uniform(-0.004, 0.004) for _ in range(16)]

    def make(k: int) -> list[dict[str, Any]]:
        ws = noisy_job("j", 16, k, rng, offsets)
        if k >= 4:  # one slow GPU: an episode, evidence, a cause
            ws[5]["clk_ratio"] *= 0.8
        return ws

    _, state = run(JobContext(job_id="j", expected_gpus=16), make, range(12))
    assert any(g.status for g in state.gpus.values())
    saved = json.loads(json.dumps(state.to_dict()))
    assert "node0000/5" in saved["gpus"] and len(saved["gpus"]) < 4  # most: lists only
    assert len(saved["gpu_keys"]) == 16
    assert JobDetectorState.from_dict(saved) == state


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"gpu_seen_ms": [1]}, ValueError),
        ({"gpu_history": ["", "00", "1x2"]}, ValueError),
        ({"gpu_history": ["", "00", "13"]}, ValueError),
        ({"gpu_history": ["", 0, "102"]}, ValueError),
        ({"gpu_keys": "n0/3"}, TypeError),
        ({"gpus": [1, 2]}, TypeError),
        ({"gpus": {"n1/0": 5}}, TypeError),
    ],
)
def test_a_damaged_saved_state_is_refused(change: dict[str, Any], error: type) -> None:
    with pytest.raises(error):
        JobDetectorState.from_dict({**_job().to_dict(), **change})
