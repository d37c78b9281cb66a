"""The consume side of ``peerwatch archive``: read the input and output topics, decode, hand to
the :class:`~peerwatch.exporters.archive.ArchiveWriter`, and commit Kafka offsets only after the
writer made the data durable (see :mod:`peerwatch.exporters.archive` for the protocol).

On (re)assignment a partition starts at the offset stored in the archive's state file, which is
authoritative; a partition the archive never saw starts at the group's committed offset, else the
earliest one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from peerwatch.errors import CodecError
from peerwatch.exporters.archive import ArchiveWriter, Offsets
from peerwatch.exporters.consume import DeadLetterSink, Message, deadletter_headers
from peerwatch.io.archive.layout import hour_of, record_time_ms
from peerwatch.schemas.codec import AvroCodec
from peerwatch.topics import (
    ACTIONS,
    HEALTH,
    JOB_EVENTS,
    JOB_WINDOWS,
    NIC_SAMPLES,
    NODE_EVENTS,
    RECOMMENDATIONS,
    SAMPLES,
    STEP_TIMES,
    STRAGGLERS,
    TopicSpec,
)

log = logging.getLogger(__name__)

#: Every topic with a schema: the pipeline's inputs and its outputs (the dead-letter topic holds
#: raw bytes of any kind and is not archived).
ARCHIVED_TOPICS: tuple[TopicSpec, ...] = (
    SAMPLES, NIC_SAMPLES, JOB_EVENTS, NODE_EVENTS, HEALTH, STEP_TIMES,
    JOB_WINDOWS, STRAGGLERS, RECOMMENDATIONS, ACTIONS,
)  # fmt: skip


def archived_topics(prefix: str = "") -> dict[str, str]:
    """Topic name (with ``prefix``) -> value schema name, for every archived topic."""
    return {prefix + t.name: str(t.value_schema) for t in ARCHIVED_TOPICS}


class ArchiveSource(Protocol):
    """Where messages come from and where durable offsets are committed (Kafka, or a fake)."""

    def consume(self, num_messages: int = 1, timeout: float = -1) -> Sequence[Message]: ...
    def commit_offsets(self, offsets: Mapping[tuple[str, int], int]) -> None: ...
    def close(self) -> None: ...


class TimestampedMessage(Message, Protocol):
    def timestamp(self) -> tuple[int, int]: ...


@dataclass
class ArchiveStats:
    records: int = 0
    undecodable: int = 0
    #: decodable records whose event time names no archive hour (before 1970, after 9999)
    bad_time: int = 0
    commits: int = 0
    consume_errors: int = 0
    #: Wall time spent in commits (fsync of the files and the state, then Kafka), s.
    commit_time_s: float = 0.0


class ArchiveLoop:
    """Consume, decode, write, and every ``flush_interval_s``/``flush_records`` commit."""

    def __init__(
        self,
        source: ArchiveSource,
        writer: ArchiveWriter,
        topic_schemas: Mapping[str, str],
        *,
        deadletter: DeadLetterSink | None = None,
        batch_size: int = 1000,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self._source = source
        self._writer = writer
        self._codecs = {t: AvroCodec(s) for t, s in topic_schemas.items()}
        self._deadletter = deadletter
        self._batch_size = batch_size
        self._clock = clock
        self._wall_ms = wall_ms
        self._last_commit_s = clock()
        self._last_retain_s = -1e18
        self.stats = ArchiveStats()

    def handle(self, msg: TimestampedMessage) -> None:
        """Decode and write one message; an undecodable one is dead-lettered and skipped (its
        offset still advances, so it is not read again)."""
        topic, partition, offset = (
            str(msg.topic()),
            int(msg.partition() or 0),
            int(msg.offset() or 0),
        )
        try:
            record: dict[str, Any] | None = self._codecs[topic].decode(msg.value() or b"")
        except (CodecError, KeyError) as exc:
            self.stats.undecodable += 1
            log.warning("archive: skipping %s[%d]@%d: %s", topic, partition, offset, exc)
            if self._deadletter is not None:
                self._deadletter.send(
                    msg.value(), msg.key(), deadletter_headers(msg, f"undecodable: {exc}")
                )
            record = None
        ts_ms = record_time_ms(record) if record is not None else None
        if ts_ms is None:
            ts_ms = int(msg.timestamp()[1])
        if record is not None:
            try:
                hour_of(ts_ms)
            except ValueError as exc:  # no file is named by that hour: dead-letter, go on
                self.stats.bad_time += 1
                log.warning("archive: skipping %s[%d]@%d: %s", topic, partition, offset, exc)
                if self._deadletter is not None:
                    self._deadletter.send(
                        msg.value(), msg.key(), deadletter_headers(msg, f"bad event time: {exc}")
                    )
                record = None
        # Decoded above to check it and to find its hour; written as its own bytes when it
        # was written with the current schema (the file's).
        body = self._codecs[topic].current_body(msg.value() or b"") if record is not None else None
        self._writer.write(topic, partition, offset, record, ts_ms, body)
        if record is not None:
            self.stats.records += 1

    def commit(self) -> Offsets:
        """Durable first, then Kafka (see the module docstring)."""
        started_s = time.monotonic()
        offsets = self._writer.commit()
        self._source.commit_offsets(offsets)
        self._last_commit_s = self._clock()
        self.stats.commits += 1
        self.stats.commit_time_s += time.monotonic() - started_s
        return offsets

    def run_once(self, timeout_s: float = 1.0) -> int:
        """Consume and write one batch, commit when due; returns how many messages it held."""
        handled = 0
        for msg in self._source.consume(num_messages=self._batch_size, timeout=timeout_s):
            if msg.error() is not None:
                self.stats.consume_errors += 1
                log.debug("consumer: %s", msg.error())
                continue
            self.handle(msg)  # type: ignore[arg-type]
            handled += 1
        now_s = self._clock()
        if self._writer.due(now_s - self._last_commit_s):
            self.commit()
        if now_s - self._last_retain_s >= 3600:
            self._last_retain_s = now_s
            for path in self._writer.retain(self._wall_ms()):
                log.info("archive: retention removed %s", path)
        return handled

    def run(self, stop: threading.Event, *, poll_timeout_s: float = 0.5) -> ArchiveStats:
        """Loop until ``stop`` is set, then commit and close the files."""
        try:
            while not stop.is_set():
                self.run_once(poll_timeout_s)
        finally:
            self._source.commit_offsets(self._writer.close())
        return self.stats


class KafkaArchiveSource:
    """A confluent-kafka consumer subscribed to the archived topics; partitions start at the
    archive's own offsets. Connects on construction (call from the command, not from logic)."""

    def __init__(self, kafka_settings: Any, group_id: str, topics: Sequence[str],
                 start_offsets: Offsets) -> None:  # fmt: skip
        from confluent_kafka import Consumer

        from peerwatch.kafka_config import consumer_config

        self._start = dict(start_offsets)
        self._consumer = Consumer(consumer_config(kafka_settings, group_id))
        self._consumer.subscribe(list(topics), on_assign=self._on_assign)

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        for tp in partitions:
            start = self._start.get((tp.topic, tp.partition))
            if start is not None:
                tp.offset = start
        consumer.assign(partitions)

    def consume(self, num_messages: int = 1, timeout: float = -1) -> Sequence[Any]:
        return self._consumer.consume(num_messages=num_messages, timeout=timeout)

    def commit_offsets(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Synchronous commit of ``offsets`` (only partitions assigned now; others were revoked
        and their new owner starts from the archive state anyway)."""
        from confluent_kafka import KafkaException, TopicPartition

        # A later (re)assignment starts where the archive is durable, never at an older commit.
        self._start.update(offsets)
        assigned = {(tp.topic, tp.partition) for tp in self._consumer.assignment()}
        tps = [
            TopicPartition(t, p, o) for (t, p), o in sorted(offsets.items()) if (t, p) in assigned
        ]
        if not tps:
            return
        try:
            self._consumer.commit(offsets=tps, asynchronous=False)
        except KafkaException as exc:  # the archive state is the authority: log, carry on
            log.warning("archive: Kafka offset commit failed: %s", exc)

    def close(self) -> None:
        self._consumer.close()
