"""Stage 3's scored GpuWindow records, produced through librdkafka instead of faust.

A job's windows leave stage 3 one record per GPU per window: with 5-second windows that is more
records than the samples coming in (a 512-GPU job sends 512 records every 5 s, its 64 nodes 320
samples). Through faust each record is a Python trip through the topic, the channel and
aiokafka's accumulator; py-spy put that at a sixth of a busy worker's time. Here each record is
one ``produce`` call into librdkafka's own queue (C, batching and compression off the GIL).

At least once, as faust's own sends: the worker's commit flushes this producer first
(:meth:`WindowOutput.guard_commits` wraps the faust producer's ``flush``, which faust awaits
before it commits offsets), so no input offset is committed before the windows it produced
are on the broker. A flush that cannot deliver everything raises, and faust does not commit.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from peerwatch.errors import ServiceError
from peerwatch.kafka_config import producer_config
from peerwatch.settings import KafkaSettings

log = logging.getLogger(__name__)

#: How long a commit waits for the windows still queued (seconds).
FLUSH_TIMEOUT_S = 30.0


class WindowOutput:
    """A confluent-kafka producer for one output topic, flushed before every faust commit."""

    def __init__(self, kafka: KafkaSettings, topic: str, producer: Any = None) -> None:
        """``producer``: a ready confluent-kafka Producer (tests); default: one made from
        ``kafka`` (murmur2 partitioner, as faust's, so a job's windows keep their partition)."""
        if producer is None:
            from confluent_kafka import Producer

            # Delivery reports of failures only: a Python callback per window costs a
            # microsecond, and flush() still waits for every record.
            conf = producer_config(kafka, **{"linger.ms": 5, "delivery.report.only.error": True})
            producer = Producer(conf)
        self.topic = topic
        self._producer = producer
        self.sent = 0
        self.failed = 0

    def send(self, key: bytes, value: bytes) -> None:
        """Queue one record; waits for deliveries while librdkafka's queue is full."""
        while True:
            try:
                self._producer.produce(self.topic, value, key, on_delivery=self._delivered)
                break
            except BufferError:
                self._producer.poll(0.1)
        self.sent += 1
        if not self.sent % 1024:
            self._producer.poll(0)

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.failed += 1
            log.error("window output to %s not delivered: %s", self.topic, err)

    def flush(self, timeout_s: float = FLUSH_TIMEOUT_S) -> None:
        """Deliver everything queued; raises ServiceError when some record was not delivered
        (then the caller must not commit the input that produced it)."""
        left = int(self._producer.flush(timeout_s))
        if left:
            raise ServiceError(f"{left} GpuWindow records to {self.topic} still queued after "
                               f"{timeout_s:g} s: the broker is not taking them")  # fmt: skip
        if self.failed:
            failed, self.failed = self.failed, 0
            raise ServiceError(f"{failed} GpuWindow records to {self.topic} not delivered")

    def guard_commits(self, faust_producer: Any) -> None:
        """Make ``faust_producer.flush`` (awaited by faust before each commit) flush this
        output too, on a thread so the event loop keeps running."""
        inner = faust_producer.flush

        async def flush() -> None:
            await inner()
            await asyncio.to_thread(self.flush)

        faust_producer.flush = flush
