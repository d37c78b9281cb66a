"""The hot stage's idle heartbeats (streams/live/closed_output.py): one goes to stage 3 when it
says something new, and one that says what the last one said only every HEARTBEAT_REPEAT_S.

Each heartbeat makes every stage-3 channel release over all its pending jobs; sent every second
while idle, unchanged, they were a share of the worker's CPU per GPU sample (issue 37). The clock
is a settable stand-in (no sleeps); the producer keeps what is sent (no broker)."""

from __future__ import annotations

import json
from typing import Any

from peerwatch.streams.live.closed_output import (
    HEARTBEAT_EVERY_S,
    HEARTBEAT_REPEAT_S,
    ClosedOutput,
)
from peerwatch.streams.live.counters import StreamCounters
from peerwatch.streams.live.delivery import OutputDelivery

CHANNELS = 3


class Producer:
    """Keeps each heartbeat produced: (partition, marks)."""

    def __init__(self) -> None:
        self.beats: list[tuple[int, dict[str, int]]] = []

    def produce(self, topic: str, value: bytes, key: bytes | None = None, **kw: Any) -> None:
        message = json.loads(value)
        assert message["kind"] == "watermark"
        self.beats.append((kw["partition"], message["marks"]))


class Clock:
    """Monotonic seconds, set by the test."""

    def __init__(self) -> None:
        self.s = 100.0

    def __call__(self) -> float:
        return self.s


def output() -> tuple[ClosedOutput, Producer, Clock]:
    producer, clock = Producer(), Clock()
    delivery = OutputDelivery("dead", StreamCounters(), producer=producer)
    return ClosedOutput(delivery, "b", CHANNELS, monotonic_s=clock), producer, clock


def no_idle(_latest: int) -> dict[int, int]:
    return {}


def test_an_unchanged_idle_heartbeat_is_not_repeated_within_the_repeat_interval() -> None:
    out, producer, clock = output()
    out.heartbeat_when_idle({0: 5000, 1: 4000}, no_idle)
    assert producer.beats == [(q, {"0": 5000, "1": 4000}) for q in range(CHANNELS)]
    producer.beats.clear()
    while clock.s < 100.0 + HEARTBEAT_REPEAT_S - HEARTBEAT_EVERY_S:
        clock.s += HEARTBEAT_EVERY_S
        out.heartbeat_when_idle({0: 5000, 1: 4000}, no_idle)
    assert producer.beats == []


def test_an_unchanged_idle_heartbeat_is_repeated_after_the_repeat_interval() -> None:
    """A stage 3 that forgot its watermarks in a rebalance hears them again."""
    out, producer, clock = output()
    out.heartbeat_when_idle({0: 5000}, no_idle)
    producer.beats.clear()
    clock.s += HEARTBEAT_REPEAT_S
    out.heartbeat_when_idle({0: 5000}, no_idle)
    assert producer.beats == [(q, {"0": 5000}) for q in range(CHANNELS)]
    producer.beats.clear()
    clock.s += HEARTBEAT_REPEAT_S - HEARTBEAT_EVERY_S  # counted from the repeat
    out.heartbeat_when_idle({0: 5000}, no_idle)
    assert producer.beats == []


def test_a_changed_mark_goes_out_at_the_next_idle_tick() -> None:
    out, producer, clock = output()
    out.heartbeat_when_idle({0: 5000, 1: 4000}, no_idle)
    producer.beats.clear()
    clock.s += HEARTBEAT_EVERY_S / 2
    out.heartbeat_when_idle({0: 5000, 1: 9000}, no_idle)  # not a tick yet
    assert producer.beats == []
    clock.s += HEARTBEAT_EVERY_S / 2
    out.heartbeat_when_idle({0: 5000, 1: 9000}, no_idle)
    assert producer.beats == [(q, {"0": 5000, "1": 9000}) for q in range(CHANNELS)]


def test_a_new_idle_mark_goes_out_at_the_next_idle_tick() -> None:
    """A partition found empty after the last heartbeat follows the latest closed-until."""
    out, producer, clock = output()
    out.heartbeat_when_idle({0: 5000, 1: None}, no_idle)
    producer.beats.clear()
    clock.s += HEARTBEAT_EVERY_S
    out.heartbeat_when_idle({0: 5000, 1: None}, lambda latest: {1: latest})
    assert producer.beats == [(q, {"0": 5000, "1": 5000}) for q in range(CHANNELS)]


def test_an_idle_heartbeat_that_says_what_the_batch_heartbeat_said_waits() -> None:
    """The heartbeat after a batch counts as the last one sent; it goes out as before."""
    out, producer, clock = output()
    out.marks[0] = 5000
    out.send({0: 5000}, no_idle)
    out.marks[0] = 5000
    out.send({0: 5000}, no_idle)  # a batch's heartbeat: sent, changed or not
    assert producer.beats == [(q, {"0": 5000}) for q in range(CHANNELS)] * 2
    producer.beats.clear()
    clock.s += HEARTBEAT_EVERY_S
    out.heartbeat_when_idle({0: 5000}, no_idle)
    assert producer.beats == []


def test_no_heartbeat_before_a_partition_closed_a_window() -> None:
    out, producer, clock = output()
    out.heartbeat_when_idle({0: None}, no_idle)
    clock.s += HEARTBEAT_REPEAT_S
    out.heartbeat_when_idle({0: None}, no_idle)
    assert producer.beats == []
