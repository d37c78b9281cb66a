"""The faust-recovery watchdog as pure code (a fake clock, a fake recovery state): a recovery
that stops reading changelog records is found stuck once, after the bound; one that keeps
reading, however long, never is."""

from __future__ import annotations

from typing import Any

import pytest

from peerwatch.streams.live.recovery_watchdog import (
    RecoveryWatch,
    RecoveryWatchdog,
    faust_recovery_state,
)


class Ticks:
    def __init__(self) -> None:
        self.s = 100.0

    def __call__(self) -> float:
        return self.s


def test_a_recovery_without_progress_is_stuck_after_the_bound() -> None:
    clock = Ticks()
    dog = RecoveryWatchdog(600.0, clock)
    assert dog.stalled_s(True, 5_000) == 0.0
    clock.s += 599.0
    assert dog.stalled_s(True, 5_000) == 599.0
    clock.s += 1.0
    assert dog.stalled_s(True, 5_000) == 600.0


def test_progress_or_leaving_recovery_resets_the_stall() -> None:
    clock = Ticks()
    dog = RecoveryWatchdog(600.0, clock)
    for left in range(10_000, 0, -1_000):  # a long recovery, reading all the time
        assert dog.stalled_s(True, left) == 0.0
        clock.s += 500.0
    assert dog.stalled_s(True, 1_000) == 500.0
    assert dog.stalled_s(False, None) == 0.0
    clock.s += 10_000.0
    assert dog.stalled_s(True, 1_000) == 0.0  # a new recovery starts its own count


def test_an_unknown_remaining_count_is_no_progress() -> None:
    clock = Ticks()
    dog = RecoveryWatchdog(60.0, clock)
    dog.stalled_s(True, 100)
    clock.s += 30.0
    assert dog.stalled_s(True, None) == 30.0
    clock.s += 30.0
    assert dog.stalled_s(True, None) == 60.0
    assert dog.stalled_s(True, 100) == 60.0  # the same count again: no progress either


def test_the_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        RecoveryWatchdog(0.0)


class FakeApp:
    """What the watchdog reads of a faust app: ``in_recovery`` and the recovery's count."""

    def __init__(self, in_recovery: bool, remaining: Any) -> None:
        self.in_recovery = in_recovery
        self.remaining = remaining
        outer = self

        class Recovery:
            def active_remaining_total(self) -> int:
                if isinstance(outer.remaining, Exception):
                    raise outer.remaining
                return int(outer.remaining)

        class Tables:
            recovery = Recovery()

        self.tables = Tables()


def test_the_faust_state_is_read_defensively() -> None:
    assert faust_recovery_state(FakeApp(False, 7)) == (False, None)
    assert faust_recovery_state(FakeApp(True, 7)) == (True, 7)
    raced = FakeApp(True, RuntimeError("dictionary changed size during iteration"))
    assert faust_recovery_state(raced) == (True, None)


def test_the_watch_reports_each_look_and_fires_once_when_stuck() -> None:
    clock = Ticks()
    app = FakeApp(True, 3)  # the changelog entry it cannot read: stays at 3 for ever
    fired: list[tuple[float, int | None]] = []
    reported: list[float] = []
    watch = RecoveryWatch(RecoveryWatchdog(600.0, clock), lambda: faust_recovery_state(app),
                          lambda s, left: fired.append((s, left)), interval_s=5.0,
                          report=reported.append)  # fmt: skip
    for _ in range(120):
        assert not watch.check_once()
        clock.s += 5.0
    assert watch.check_once() and fired == [(600.0, 3)] and watch.fired
    assert reported[0] == 0.0 and reported[-1] == 600.0


def test_a_failing_look_does_not_end_the_watch_thread() -> None:
    calls: list[int] = []

    def state() -> tuple[bool, int | None]:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("surprise")
        return True, 1

    fired: list[float] = []
    watch = RecoveryWatch(RecoveryWatchdog(0.001), state, lambda s, _l: fired.append(s),
                          interval_s=0.01).start()  # fmt: skip
    watch._thread.join(30)  # ends after firing; a hang fails here
    assert not watch._thread.is_alive() and len(fired) == 1 and len(calls) >= 2


def test_the_stream_command_logs_stops_and_then_ends_a_stuck_worker(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The wiring of ``peerwatch stream``: the error names the bound, faust is asked to stop
    (SIGTERM to itself), and the process is ended with status 3 if it has not stopped by the
    grace time. (No signal is sent and nothing ends here: both are recorded instead.)"""
    import os
    import signal
    import threading

    from peerwatch.commands import stream as stream_command
    from peerwatch.streams.live.counters import StreamCounters

    killed: list[tuple[int, int]] = []
    ended = threading.Event()
    statuses: list[int] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: killed.append((pid, sig)))
    monkeypatch.setattr(os, "_exit", lambda code: (statuses.append(code), ended.set()))
    monkeypatch.setattr(stream_command, "STOP_GRACE_S", 0.01)
    app = FakeApp(True, 3)
    app.peerwatch_counters = StreamCounters()  # type: ignore[attr-defined]
    watch = stream_command.watch_recovery(app, 0.05)
    assert ended.wait(30)
    watch.stop()
    assert watch.fired and killed == [(os.getpid(), signal.SIGTERM)] and statuses == [3]
    assert "table recovery made no progress" in caplog.text
    assert "stream.recovery_timeout_s = 0.05" in caplog.text
    assert app.peerwatch_counters.recovery_stalled_s >= 0.05  # type: ignore[attr-defined]
