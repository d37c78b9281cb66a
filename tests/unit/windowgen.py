"""Synthetic GpuWindow dicts for detector and policy tests (seeded, no I/O)."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from typing import Any

from peerwatch.streams.core.detector import DetectionResult, detect_job_window
from peerwatch.streams.core.detector_state import JobDetectorState
from peerwatch.streams.core.model import JobContext
from peerwatch.streams.core.settings import DetectorSettings

WINDOW_MS = 30_000
GPUS_PER_NODE = 8
#: The detector settings of these 30-second windows: DETECTION.md's rule in windows (SUSPECT on
#: the first candidate window, CONFIRMED after 4 of the last 6, cleared after 10 clean ones).
SETTINGS_30S = DetectorSettings(window_s=30, confirm_flagged_s=120, confirm_span_s=180)


def gpu_ident(i: int) -> tuple[str, int]:
    """Node and index of the i-th GPU of a job (8 GPUs per node)."""
    return f"node{i // GPUS_PER_NODE:04d}", i % GPUS_PER_NODE


def window(job_id: str, i: int, k: int, **fields: Any) -> dict[str, Any]:
    """A healthy, busy GPU window (clk 0.90, sm 0.90, no throttle) of GPU i in window k."""
    node, index = gpu_ident(i)
    w: dict[str, Any] = {
        "job_id": job_id,
        "node": node,
        "gpu_index": index,
        "gpu_uuid": f"GPU-{node}-{index}",
        "window_start_ms": k * WINDOW_MS,
        "window_end_ms": (k + 1) * WINDOW_MS,
        "samples": 30,
        "clk_ratio": 0.90,
        "throttle_frac": 0.0,
        "power_cap_frac": 0.0,
        "sm_frac": 0.90,
        "power_ratio": 0.80,
        "ecc_uncorrected_delta": 0,
        "nvlink_errors_delta": 0,
        "pcie_replay_delta": 0,
        "pcie_link_width_min": 16,
        "pcie_link_width_max": 16,
        "remap_pending": False,
        "remap_failed": False,
        "lost": False,
        "xids": [],
        "step_ms": None,
    }
    w.update(fields)
    return w


def noisy_job(
    job_id: str,
    n: int,
    k: int,
    rng: random.Random,
    offsets: list[float],
    *,
    clk_jitter: float = 0.01,
    base_clk: float = 0.90,
    with_step: bool = False,
) -> list[dict[str, Any]]:
    """Healthy peers: clk within +/-clk_jitter (a fixed per-GPU part plus per-window noise),
    sm 0.85-0.91, thr 0-1%, power ratio spread about 13%."""
    out = []
    for i in range(n):
        clk = base_clk * (1 + offsets[i] + rng.uniform(-clk_jitter / 2, clk_jitter / 2))
        fields: dict[str, Any] = {
            "clk_ratio": clk,
            "sm_frac": 0.88 + rng.uniform(-0.03, 0.03),
            "throttle_frac": rng.uniform(0.0, 0.01),
            "power_ratio": 0.75 * (1 + rng.uniform(-0.065, 0.065)),
        }
        if with_step:
            fields["step_ms"] = 1000.0 * (1 + rng.uniform(-0.01, 0.01))
        out.append(window(job_id, i, k, **fields))
    return out


Maker = Callable[[int], list[dict[str, Any]]]


def run(
    job: JobContext,
    make: Maker,
    windows: range,
    settings: DetectorSettings | None = None,
    state: JobDetectorState | None = None,
) -> tuple[list[DetectionResult], JobDetectorState]:
    """Run the detector over windows ``make(k)`` for k in ``windows``."""
    settings = settings or SETTINGS_30S
    state = state or JobDetectorState(job_id=job.job_id)
    results = [detect_job_window(job, make(k), state, settings) for k in windows]
    return results, state


def findings(results: list[DetectionResult]) -> list[dict[str, Any]]:
    return [f for r in results for f in r.findings]


def statuses(results: list[DetectionResult], **match: Any) -> list[tuple[int, str]]:
    """(window index in results, status) of findings whose fields equal ``match``."""
    out = []
    for idx, r in enumerate(results):
        for f in r.findings:
            if all(f.get(k) == v for k, v in match.items()):
                out.append((idx, f["status"]))
    return out


def with_overrides(
    base: list[dict[str, Any]], overrides: Mapping[int, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Copy of ``base`` with GPU i's fields replaced by ``overrides[i]``."""
    out = []
    for i, w in enumerate(base):
        w = dict(w)
        w.update(overrides.get(i, {}))
        out.append(w)
    return out
