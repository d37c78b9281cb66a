"""Stage 3's window output: every record queued, a full queue waited out, and a faust commit
never ahead of the windows (the faust producer's flush flushes this output after its own).

The producer here is a stand-in for confluent-kafka's (produce/poll/flush with librdkafka's
behaviours: BufferError on a full queue, flush returning what is left); the real one is used by
the stream worker's integration tests."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from peerwatch.errors import ServiceError
from peerwatch.settings import KafkaSettings
from peerwatch.streams.live.window_output import WindowOutput


class FakeProducer:
    def __init__(self, capacity: int = 1000, stuck: bool = False) -> None:
        self.capacity = capacity
        self.stuck = stuck
        self.queued: list[tuple[str, bytes, bytes, Any]] = []
        self.delivered: list[tuple[str, bytes, bytes]] = []
        self.polls = 0
        self.fail_next = False

    def produce(self, topic: str, value: bytes, key: bytes, on_delivery: Any = None) -> None:
        if len(self.queued) >= self.capacity:
            raise BufferError("Local: Queue full")
        self.queued.append((topic, key, value, on_delivery))

    def _deliver(self) -> None:
        if self.stuck:
            return
        for topic, key, value, cb in self.queued:
            err = "Broker: refused" if self.fail_next else None
            if cb is not None:
                cb(err, None)
            if err is None:
                self.delivered.append((topic, key, value))
        self.queued = []

    def poll(self, _timeout: float) -> int:
        self.polls += 1
        self._deliver()
        return 0

    def flush(self, _timeout: float) -> int:
        self._deliver()
        return len(self.queued)


def test_records_are_queued_in_order_and_delivered_on_flush() -> None:
    producer = FakeProducer()
    out = WindowOutput(KafkaSettings(), "pw.windows", producer)
    for i in range(5):
        out.send(b"job-1", f"w{i}".encode())
    assert out.sent == 5 and not producer.delivered
    out.flush()
    assert producer.delivered == [("pw.windows", b"job-1", f"w{i}".encode()) for i in range(5)]


def test_a_full_queue_is_waited_out_not_dropped() -> None:
    producer = FakeProducer(capacity=3)
    out = WindowOutput(KafkaSettings(), "t", producer)
    for i in range(10):
        out.send(b"k", bytes([i]))
    out.flush()
    assert [v for _, _, v in producer.delivered] == [bytes([i]) for i in range(10)]
    assert producer.polls >= 3


def test_flush_raises_when_records_stay_queued() -> None:
    out = WindowOutput(KafkaSettings(), "t", FakeProducer(stuck=True))
    out.send(b"k", b"v")
    with pytest.raises(ServiceError, match="1 GpuWindow records to t still queued"):
        out.flush(0.01)


def test_flush_raises_when_a_record_was_refused() -> None:
    producer = FakeProducer()
    out = WindowOutput(KafkaSettings(), "t", producer)
    producer.fail_next = True
    out.send(b"k", b"v")
    with pytest.raises(ServiceError, match="1 GpuWindow records to t not delivered"):
        out.flush()
    producer.fail_next = False
    out.send(b"k", b"w")
    out.flush()  # the failure was reported once; later deliveries are fine


class FaustProducer:
    """What faust's consumer awaits before it commits offsets."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def flush(self) -> None:
        self.log.append("faust flushed")


def test_a_faust_commit_waits_for_the_windows_and_stops_on_failure() -> None:
    log: list[str] = []
    producer = FakeProducer()
    out = WindowOutput(KafkaSettings(), "t", producer)
    faust_producer = FaustProducer(log)
    out.guard_commits(faust_producer)
    out.send(b"k", b"v")
    asyncio.run(faust_producer.flush())
    assert log == ["faust flushed"] and producer.delivered == [("t", b"k", b"v")]
    producer.stuck = True
    out.send(b"k", b"w")
    with pytest.raises(ServiceError):  # faust does not commit past windows not on the broker
        asyncio.run(faust_producer.flush())
