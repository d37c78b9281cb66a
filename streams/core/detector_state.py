"""Explicit, serialisable detector state (one object per job).

The live stream keeps ``JobDetectorState.to_dict()`` in a changelog-backed table keyed by job and
rebuilds it with ``from_dict`` after a restart; replay and evaluation hold the objects directly.
Everything is plain JSON types (str keys, ints, floats, lists, None).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class GpuDetectorState:
    """Persistence and baseline memory of one GPU in one job.

    ``status`` is None (no episode), ``"SUSPECT"`` or ``"CONFIRMED"``; ``episode_start_ms`` is
    the start of the episode's first candidate window (set on a candidate window before the
    SUSPECT itself). ``history`` holds one code per evaluated window, newest last, as long as the
    longer of the suspect and confirm spans: 0 clean, 1 flagged by a confirming feature, 2
    flagged by another feature only (sm). ``cause`` is the episode's named cause (FindingCause).
    ``hard_last_ms`` maps a hard rule to the start of the last window it fired in.
    """

    status: str | None = None
    episode_start_ms: int | None = None
    history: list[int] = field(default_factory=list)
    cusum: float = 0.0
    clean_streak: int = 0
    since_emit: int = 0
    baseline_clk: list[float] = field(default_factory=list)
    hard_last_ms: dict[str, int] = field(default_factory=dict)
    last_seen_ms: int | None = None
    cause: str | None = None

    def reset_episode(self) -> None:
        self.status = None
        self.cause = None
        self.episode_start_ms = None
        self.history = []
        self.cusum = 0.0
        self.clean_streak = 0
        self.since_emit = 0

    def to_dict(self) -> dict[str, Any]:
        """The fields that differ from a fresh state (:meth:`from_dict` fills in the rest): the
        live worker saves each job's state after each window, a 512-GPU job's mostly idle
        memories included. Field by field (dataclasses.asdict deep-copies every value)."""
        out: dict[str, Any] = {"last_seen_ms": self.last_seen_ms}
        if self.status is not None:
            out["status"] = self.status
        if self.episode_start_ms is not None:
            out["episode_start_ms"] = self.episode_start_ms
        if self.history:
            out["history"] = list(self.history)
        if self.cusum:
            out["cusum"] = self.cusum
        if self.clean_streak:
            out["clean_streak"] = self.clean_streak
        if self.since_emit:
            out["since_emit"] = self.since_emit
        if self.baseline_clk:
            out["baseline_clk"] = list(self.baseline_clk)
        if self.hard_last_ms:
            out["hard_last_ms"] = dict(self.hard_last_ms)
        if self.cause is not None:
            out["cause"] = self.cause
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GpuDetectorState:
        return cls(
            status=data.get("status"),
            episode_start_ms=data.get("episode_start_ms"),
            history=[int(v) for v in data.get("history") or []],
            cusum=float(data.get("cusum") or 0.0),
            clean_streak=int(data.get("clean_streak") or 0),
            since_emit=int(data.get("since_emit") or 0),
            baseline_clk=[float(v) for v in data.get("baseline_clk") or []],
            hard_last_ms={str(k): int(v) for k, v in (data.get("hard_last_ms") or {}).items()},
            last_seen_ms=data.get("last_seen_ms"),
            cause=data.get("cause"),
        )


@dataclass
class JobDetectorState:
    """Detector memory for one job: window counter, job-wide episode, per-GPU states.

    ``gpus`` is keyed by ``node/index`` (see :func:`peerwatch.streams.core.model.gpu_key`).
    ``last_window_start_ms`` lets the detector skip a window it has already processed (a
    redelivery after a restart) instead of emitting its findings twice.
    """

    job_id: str
    windows_seen: int = 0
    last_window_start_ms: int | None = None
    anchor_ms: int | None = None
    max_gpus_seen: int = 0
    job_wide_start_ms: int | None = None
    job_wide_clean: int = 0
    #: The job's median SM activity in its last window with any (the phase-change gate).
    last_job_sm: float | None = None
    #: The job's median throttled share in its last window with any (the same gate).
    last_job_thr: float | None = None
    gpus: dict[str, GpuDetectorState] = field(default_factory=dict)

    def gpu(self, key: str) -> GpuDetectorState:
        """The state of GPU ``key``, created empty on first use."""
        state = self.gpus.get(key)
        if state is None:
            state = self.gpus[key] = GpuDetectorState()
        return state

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "windows_seen": self.windows_seen,
            "last_window_start_ms": self.last_window_start_ms,
            "anchor_ms": self.anchor_ms,
            "max_gpus_seen": self.max_gpus_seen,
            "job_wide_start_ms": self.job_wide_start_ms,
            "job_wide_clean": self.job_wide_clean,
            "last_job_sm": self.last_job_sm,
            "last_job_thr": self.last_job_thr,
            "gpus": {k: self.gpus[k].to_dict() for k in sorted(self.gpus)},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobDetectorState:
        return cls(
            job_id=str(data["job_id"]),
            windows_seen=int(data.get("windows_seen") or 0),
            last_window_start_ms=data.get("last_window_start_ms"),
            anchor_ms=data.get("anchor_ms"),
            max_gpus_seen=int(data.get("max_gpus_seen") or 0),
            job_wide_start_ms=data.get("job_wide_start_ms"),
            job_wide_clean=int(data.get("job_wide_clean") or 0),
            last_job_sm=data.get("last_job_sm"),
            last_job_thr=data.get("last_job_thr"),
            gpus={
                str(k): GpuDetectorState.from_dict(v) for k, v in (data.get("gpus") or {}).items()
            },
        )
