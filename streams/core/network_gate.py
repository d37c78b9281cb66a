"""When the network comparison of a job may name a node: the job slowed as a whole (DETECTION.md
"Network", the gate).

A degraded link slows every rank of its job alike: each GPU waits in the collectives, so the
GPUs' SM activity (and step time) moves together and the GPU detector, which compares GPUs with
their peers, sees nothing that stands out (its ``JOB_WIDE`` verdict needs more than
``job_wide_frac`` of a group to stand out *against the group*, which a uniform slowdown never
does). So the job is compared with **its own recent past**: per window, the job's median SM
activity (and median step time, where step times come) against the median of its last
``network.pace_windows`` *normal* windows. The window is **slowed** when SM activity is at least
``network.slow_rel`` below that reference, or step time at least ``slow_rel`` above it. Slowed
windows do not enter the reference (a slowdown does not become the job's normal while it lasts),
unless it lasts ``network.pace_memory_s``: then the reference starts again from the present
level (a job that changed phase for good). The gate is open when the window is slowed or the
GPU detector's verdict is job-wide; the comparison names a port only while it is open.

Pure and small: :class:`JobPace` is one job's memory (plain data, :meth:`JobPace.to_dict`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from peerwatch.streams.core.robust import median
from peerwatch.streams.core.settings import NetworkSettings

#: Fewest normal windows before the job's own past is a reference.
MIN_REFERENCE_WINDOWS = 3


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


@dataclass
class JobPace:
    """One job's recent normal windows: SM activity and step-time medians (oldest first) and
    the start (ms) of the last normal window (None: none yet)."""

    sm: list[float] = field(default_factory=list)
    step: list[float] = field(default_factory=list)
    last_normal_ms: int | None = None
    #: start (ms) of the last window judged: an older or repeated one changes nothing
    last_start_ms: int | None = None

    def slowed(
        self,
        start_ms: int,
        sm_median: float | None,
        step_median: float | None,
        settings: NetworkSettings,
    ) -> bool:
        """One window of the job (in window order): whether it is slowed against the job's own
        recent past; the memory is updated. ``sm_median``: the job's median SM activity
        (0..1) in the window, ``step_median`` its median step time (ms); None (or NaN) where
        the window has none."""
        if self.last_start_ms is not None and start_ms <= self.last_start_ms:
            return False
        self.last_start_ms = start_ms
        sm, step = _finite(sm_median), _finite(step_median)
        slow = False
        if sm is not None and len(self.sm) >= MIN_REFERENCE_WINDOWS:
            slow |= sm <= (1.0 - settings.slow_rel) * median(self.sm)
        if step is not None and len(self.step) >= MIN_REFERENCE_WINDOWS:
            slow |= step >= (1.0 + settings.slow_rel) * median(self.step)
        if slow and self.last_normal_ms is not None:
            if start_ms - self.last_normal_ms < settings.pace_memory_s * 1000:
                return True
            # slow for longer than the memory: this is the job's level now
            self.sm, self.step = [], []
        keep = settings.pace_windows
        if sm is not None:
            self.sm = [*self.sm, sm][-keep:]
        if step is not None:
            self.step = [*self.step, step][-keep:]
        if sm is not None or step is not None:
            self.last_normal_ms = start_ms
        return slow

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON data (:meth:`from_dict` takes it back)."""
        return {
            "sm": list(self.sm),
            "step": list(self.step),
            "last_normal_ms": self.last_normal_ms,
            "last_start_ms": self.last_start_ms,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobPace:
        """From :meth:`to_dict` (the caller's own store). Raises KeyError/TypeError/ValueError
        on a malformed one."""
        last, judged = data["last_normal_ms"], data["last_start_ms"]
        return cls(
            [float(v) for v in data["sm"]],
            [float(v) for v in data["step"]],
            None if last is None else int(last),
            None if judged is None else int(judged),
        )
