"""Detector state serialisation: field by field, nothing left out, fresh values omitted."""

from __future__ import annotations

from dataclasses import asdict

from peerwatch.streams.core.detector_state import GpuDetectorState, JobDetectorState


def test_to_dict_is_every_field_and_round_trips() -> None:
    job = JobDetectorState(job_id="7", windows_seen=3, last_window_start_ms=90_000, anchor_ms=0,
                           max_gpus_seen=16, job_wide_start_ms=30_000, job_wide_clean=1)  # fmt: skip
    gpu = job.gpu("n1/0")
    gpu.status, gpu.episode_start_ms, gpu.history = "SUSPECT", 60_000, [1, 0, 1]
    gpu.cusum, gpu.clean_streak, gpu.since_emit = 2.5, 1, 2
    gpu.baseline_clk, gpu.hard_last_ms, gpu.last_seen_ms = [0.99, 0.98], {"xid_79": 60_000}, 90_000
    gpu.cause = "CLOCKS"
    job.gpu("n0/3").last_seen_ms = 85_000
    out = job.to_dict()
    full = asdict(job)
    assert out["gpus"]["n1/0"] == full["gpus"]["n1/0"]  # every field, by value
    # a GPU with nothing to remember but when it was seen: only that
    assert out["gpus"]["n0/3"] == {"last_seen_ms": 85_000}
    assert {k: v for k, v in out.items() if k != "gpus"} == {
        k: v for k, v in full.items() if k != "gpus"
    }
    assert list(out["gpus"]) == ["n0/3", "n1/0"]
    assert out["gpus"]["n1/0"]["history"] is not gpu.history  # a copy, not the live list
    assert JobDetectorState.from_dict(out) == job
    assert GpuDetectorState.from_dict(gpu.to_dict()) == gpu
