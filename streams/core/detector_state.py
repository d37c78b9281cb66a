"""Explicit, serialisable detector state (one object per job).

The live stream keeps ``JobDetectorState.to_dict()`` in a changelog-backed table keyed by job and
rebuilds it with ``from_dict`` after a restart; replay and evaluation hold the objects directly.
Everything is plain JSON types (str keys, ints, floats, lists, None).

The live worker saves a job's state after each of its windows, so the form is compact: what
every GPU has (its key, when it was last seen, its history codes as one string) in three
parallel lists, and a dict only for the GPUs that remember more (an episode, a baseline, a hard
rule). The per-GPU dict form of earlier versions is still read.
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

    def extra(self) -> dict[str, Any] | None:
        """The fields besides ``last_seen_ms`` and ``history`` that differ from a fresh state
        (None: none does), as :meth:`to_dict` gives them."""
        if (
            self.status is None
            and self.episode_start_ms is None
            and not self.cusum
            and not self.clean_streak
            and not self.since_emit
            and not self.baseline_clk
            and not self.hard_last_ms
            and self.cause is None
        ):
            return None
        out = self.to_dict()
        del out["last_seen_ms"]
        out.pop("history", None)
        return out

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
        """The job's state (see the module docstring): ``gpu_keys`` sorted, ``gpu_seen_ms`` and
        ``gpu_history`` (codes as digits) in the same order, ``gpus`` the rest of the GPUs that
        have any."""
        gpus = self.gpus
        keys = sorted(gpus)
        states = [gpus[k] for k in keys]
        extras = {k: e for k, g in zip(keys, states, strict=True) if (e := g.extra()) is not None}
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
            "gpu_keys": keys,
            "gpu_seen_ms": [g.last_seen_ms for g in states],
            "gpu_history": [bytes(g.history).translate(_DIGITS).decode() for g in states],
            "gpus": extras,
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
            gpus=_gpus_of(data),
        )


_HISTORY_CODES = frozenset("012")
#: History codes (0-2) as the digits of the saved form: ``bytes(history).translate(_DIGITS)``
#: (a quarter of the time of joining their ``str``s; the state is saved after every window).
_DIGITS = bytes.maketrans(bytes(range(3)), b"012")


def _gpus_of(data: Mapping[str, Any]) -> dict[str, GpuDetectorState]:
    """The GPU states of a saved job state, compact or of the per-GPU dict form. Raises
    ValueError or TypeError for a damaged one."""
    extras = data.get("gpus") or {}
    if not isinstance(extras, Mapping):
        raise TypeError(f"saved GPU states of type {type(extras).__name__}")
    if "gpu_keys" not in data:  # the per-GPU dict form of earlier versions
        return {str(k): GpuDetectorState.from_dict(v) for k, v in extras.items()}
    keys, seen, history = data["gpu_keys"], data["gpu_seen_ms"], data["gpu_history"]
    if not (isinstance(keys, list) and isinstance(seen, list) and isinstance(history, list)):
        raise TypeError("saved GPU states: gpu_keys, gpu_seen_ms and gpu_history must be lists")
    if not len(keys) == len(seen) == len(history):
        raise ValueError("saved GPU states: gpu_keys, gpu_seen_ms and gpu_history differ in length")
    out: dict[str, GpuDetectorState] = {}
    for key, seen_ms, codes in zip(keys, seen, history, strict=True):
        if not isinstance(codes, str) or not set(codes) <= _HISTORY_CODES:
            raise ValueError(f"saved GPU state {key!r}: history {codes!r} is not codes 0-2")
        state = GpuDetectorState.from_dict(
            {**(extras.get(key) or {}), "last_seen_ms": seen_ms, "history": list(codes)}
        )
        out[str(key)] = state
    return out
