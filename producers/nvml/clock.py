"""The injected wall clock: every timestamp the producers write comes from here."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Wall clock in integer milliseconds since the epoch (UTC)."""

    def now_ms(self) -> int: ...


class SystemClock:
    """The real clock: ``time.time_ns()`` truncated to milliseconds."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000
