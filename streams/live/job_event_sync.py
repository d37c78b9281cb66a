"""The hot stage's allocation view kept in step with the job-events topic.

A consumer outside any group reads every partition of the job-events topic from the beginning
(14 days of retention) into the stage's one allocation table for the whole cluster (JobEvents
are few). Before a batch of samples goes to stage 2, :meth:`JobEventSync.sync` brings it up to
the job-events' end offsets as asked *after* the samples were fetched: every JobEvent appended
to the log before those samples is applied first. So a job's start and end are never raced by
its own samples, however fast the input comes (replay sees them in the same order).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from peerwatch.errors import CodecError
from peerwatch.kafka_config import admin_config, consumer_config
from peerwatch.schemas.codec import AvroCodec
from peerwatch.settings import KafkaSettings
from peerwatch.streams.core.model import InvalidRecordError

log = logging.getLogger(__name__)


class JobEventSync:
    """Job events read into ``apply`` (the stage's :meth:`apply_job_event`), up to the end
    offsets on each :meth:`sync`. ``stop``: set when the worker stops (no retry then)."""

    def __init__(
        self,
        kafka: KafkaSettings,
        topic: str,
        group: str,
        apply: Callable[[Mapping[str, Any]], None],
        stop: threading.Event,
    ) -> None:
        self.kafka = kafka
        self.topic = topic
        self.group = group
        self.apply = apply
        self.stop = stop
        self.codec = AvroCodec("JobEvent")
        self.seen = self.bad = 0
        self._admin: Any = None
        self._consumer: Any = None
        self._tps: list[Any] = []
        self._next: dict[int, int] = {}  # partition -> next offset to apply

    def start(self) -> None:
        """Create the clients and assign every partition from its beginning. Raises
        KafkaException when the topic's metadata cannot be read in 30 s."""
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
        from confluent_kafka.admin import AdminClient

        self._admin = AdminClient(admin_config(self.kafka))
        self._consumer = Consumer(consumer_config(self.kafka, f"{self.group}-job-events", **{
            "enable.partition.eof": False,
        }))  # fmt: skip
        meta = self._consumer.list_topics(self.topic, timeout=30).topics
        partitions = sorted(meta[self.topic].partitions)
        self._tps = [TopicPartition(self.topic, p) for p in partitions]
        self._consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in partitions])

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()

    def sync(self, limit_s: float = 30.0) -> None:
        """Apply every JobEvent appended before now (end offsets asked now, then read up to
        them). Gives up after ``limit_s`` with a warning (a broker that cannot serve them)."""
        highs = self._end_offsets()
        if highs is None:
            return
        ends = {p: h for p, h in highs.items() if h > self._next.get(p, 0)}
        deadline = time.monotonic() + limit_s
        while ends:
            if time.monotonic() > deadline:
                log.warning("hot stage: job events not read up to %s in %.0f s; going on",
                            ends, limit_s)  # fmt: skip
                return
            messages = self._consumer.consume(1000, timeout=0.5)
            for m in messages:
                if m.error() is not None:
                    log.warning("hot stage job-events error: %s", m.error())
                    continue
                self._next[m.partition()] = m.offset() + 1
                self.apply_message(m)
            if not messages:  # offsets can have gaps: ask where the consumer stands
                for tp in self._consumer.position(self._tps):
                    if tp.offset >= 0:
                        self._next[tp.partition] = max(self._next.get(tp.partition, 0), tp.offset)
            ends = {p: h for p, h in ends.items() if self._next.get(p, 0) < h}

    def _end_offsets(self) -> dict[int, int] | None:
        """Each partition's end offset, asked through the admin client (on the consumer's own
        connection the request would queue behind its long-polling fetch, up to
        fetch.wait.max.ms per partition). Retried while the broker cannot answer: samples wait,
        since aggregating them against allocations that may be missing would attribute them
        wrongly. None: the worker stops."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        while not self.stop.is_set():
            try:
                futures = self._admin.list_offsets(
                    {tp: latest for tp in self._tps}, request_timeout=10
                )
                return {tp.partition: f.result().offset for tp, f in futures.items()}
            except KafkaException as exc:
                log.warning("hot stage: job-events end offsets unavailable (%s); retrying", exc)
                # A fresh client: after a broker restart the partitions' leader epoch moved on,
                # and this client kept asking with the old one (FENCED_LEADER_EPOCH) forever,
                # so the worker stayed alive but processed nothing (tests/integration/
                # test_chaos.py). A new client starts from fresh metadata.
                self._admin = AdminClient(admin_config(self.kafka))
                self.stop.wait(1.0)
        return None

    def apply_message(self, m: Any) -> None:
        """Decode and apply one job-events message; a bad one is logged and counted (stage 3
        dead-letters the same record)."""
        self.seen += 1
        try:
            self.apply(self.codec.decode(m.value() or b""))
        except (CodecError, InvalidRecordError, KeyError, ValueError, TypeError) as exc:
            self.bad += 1
            log.warning("hot stage: job event %d@%d not applied: %s",
                        m.partition(), m.offset(), exc)  # fmt: skip
