"""The one injected clock: wall time in epoch milliseconds and monotonic time in seconds.

Everything that reads the time takes a :class:`Clock` so that tests can drive it:

* ``now_ms()``: wall clock, integer milliseconds since the epoch (UTC). Every timestamp written
  into a record (``ts_ms``, ``decided_ms``, ...) comes from here.
* ``monotonic_s()``: processing time, float seconds from an arbitrary origin, never going back.
  Only for durations and timeouts (series eviction, ...), never written into a record.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Wall time (``now_ms``, int ms since the epoch) and monotonic time (``monotonic_s``)."""

    def now_ms(self) -> int:
        """Now, integer milliseconds since the epoch (UTC)."""
        ...

    def monotonic_s(self) -> float:
        """Monotonic processing time in seconds (only differences mean anything)."""
        ...


class SystemClock:
    """The real clock: ``time.time_ns()`` truncated to milliseconds, ``time.monotonic()``."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_s(self) -> float:
        return time.monotonic()


#: The shared real clock (stateless): the default wherever a clock is optional.
SYSTEM_CLOCK: Clock = SystemClock()
