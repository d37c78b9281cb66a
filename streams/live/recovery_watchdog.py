"""A watchdog for faust's table recovery: a recovery that stops progressing becomes an error.

faust reads the state tables' changelogs back before stages 3 and 4 process anything. A
recovery that never completes (a changelog entry it cannot read, a partition it waits on for
ever) leaves a worker that looks alive, holds its partitions and does nothing. The watchdog
looks every few seconds from a thread of its own (faust's timers only start once recovery has
completed): while faust is in recovery and the count of changelog records left to read has not
gone down for ``timeout_s``, the recovery is stuck; the worker then logs an error and exits
non-zero, so that its service manager restarts it (and the alert on
``peerwatch_stream_recovery_stalled_seconds`` fires). A large recovery that keeps reading is
never stopped, however long it takes.

:class:`RecoveryWatchdog` is the pure rule (a clock injected); :class:`RecoveryWatch` the thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class RecoveryWatchdog:
    """How long a recovery has gone without progress (seconds, ``clock`` monotonic).

    Progress is the count of records left to read going down; ``None`` (not known) counts as no
    progress. Leaving recovery resets it."""

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.timeout_s = timeout_s
        self.clock = clock
        self._since_s: float | None = None
        self._lowest: int | None = None

    def stalled_s(self, in_recovery: bool, remaining: int | None) -> float:
        """Seconds since the recovery last progressed (0.0 when not in recovery)."""
        now = self.clock()
        if not in_recovery:
            self._since_s, self._lowest = None, None
            return 0.0
        if self._since_s is None or (
            remaining is not None and (self._lowest is None or remaining < self._lowest)
        ):
            self._since_s = now
            self._lowest = remaining if remaining is not None else self._lowest
        return now - self._since_s


def faust_recovery_state(app: Any) -> tuple[bool, int | None]:
    """(in recovery, changelog records left to read or None when faust cannot say now). Read
    from another thread than faust's: a read that races a change counts as unknown."""
    in_recovery = bool(getattr(app, "in_recovery", False))
    if not in_recovery:
        return False, None
    try:
        return True, int(app.tables.recovery.active_remaining_total())
    except Exception:  # a dict changed size under us, recovery not set up yet: unknown
        return True, None


class RecoveryWatch:
    """Checks ``state()`` every ``interval_s`` (a daemon thread); once the watchdog says stuck,
    calls ``on_stuck(seconds stalled, records left)`` once and ends. ``report(stalled_s)``
    receives every check's stall (the worker's gauge)."""

    def __init__(
        self,
        watchdog: RecoveryWatchdog,
        state: Callable[[], tuple[bool, int | None]],
        on_stuck: Callable[[float, int | None], None],
        *,
        interval_s: float,
        report: Callable[[float], None] = lambda _s: None,
    ) -> None:
        self.watchdog = watchdog
        self._state = state
        self._on_stuck = on_stuck
        self._report = report
        self.interval_s = interval_s
        self.fired = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peerwatch-recovery-watch",
                                        daemon=True)  # fmt: skip

    def start(self) -> RecoveryWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.interval_s + 5)

    def check_once(self) -> bool:
        """One look; True when the recovery was found stuck (``on_stuck`` called)."""
        in_recovery, remaining = self._state()
        stalled = self.watchdog.stalled_s(in_recovery, remaining)
        self._report(stalled)
        if stalled < self.watchdog.timeout_s:
            return False
        self.fired = True
        self._on_stuck(stalled, remaining)
        return True

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                if self.check_once():
                    return
            except Exception:  # the watch must not die unseen; the next look tries again
                log.exception("recovery watchdog: a check failed")
