"""The Kafka consume loop feeding an exporter :class:`~peerwatch.exporters.base.Sink`.

Reads the output topics (job windows, job events, stragglers, recommendations, health results,
drain actions), decodes each value with the Avro codec and hands it to the sink. A record that
cannot be decoded or mapped is counted, logged and published to the dead-letter topic with the
reason in its headers; the loop carries on. Offsets are committed after the sink took a batch
(at least once: a redelivered window is recognised by the series store and not counted twice).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from peerwatch.errors import CodecError
from peerwatch.exporters.base import ExportError, Sink
from peerwatch.io.deadletter import KafkaDeadLetter, dead_letter_headers
from peerwatch.schemas.codec import decode_any
from peerwatch.topics import (
    ACTIONS,
    DEADLETTER,
    HEALTH,
    JOB_EVENTS,
    JOB_WINDOWS,
    NIC_SAMPLES,
    RECOMMENDATIONS,
    STRAGGLERS,
)

log = logging.getLogger(__name__)

EXPORTED_TOPICS = (JOB_WINDOWS, JOB_EVENTS, STRAGGLERS, RECOMMENDATIONS, HEALTH, ACTIONS)
#: Read only by the OTLP exporter (per-port metrics); a JSON line per node per tick would bury
#: the stdout exporter's findings.
NIC_TOPICS = (NIC_SAMPLES,)
STAGE = "export"


def export_topics(prefix: str = "", *, nic: bool = False) -> list[str]:
    """Names of the topics the exporters read, with the settings' ``topic_prefix``; with
    ``nic`` the NIC samples too (the OTLP exporter)."""
    return [prefix + t.name for t in EXPORTED_TOPICS + (NIC_TOPICS if nic else ())]


def deadletter_topic(prefix: str = "") -> str:
    """Name of the dead-letter topic with the settings' ``topic_prefix``."""
    return prefix + DEADLETTER.name


class Message(Protocol):
    """The part of ``confluent_kafka.Message`` the loop uses."""

    def error(self) -> Any: ...
    def value(self) -> bytes | None: ...
    def key(self) -> bytes | None: ...
    def topic(self) -> str | None: ...
    def partition(self) -> int | None: ...
    def offset(self) -> int | None: ...


class MessageSource(Protocol):
    """The part of ``confluent_kafka.Consumer`` the loop uses."""

    def consume(self, num_messages: int = 1, timeout: float = -1) -> Sequence[Message]: ...
    def commit(self, *args: Any, **kwargs: Any) -> Any: ...
    def close(self) -> None: ...


class DeadLetterSink(Protocol):
    """Where undecodable records go: ``send(value, key, headers)``."""

    def send(
        self, value: bytes | None, key: bytes | None, headers: list[tuple[str, bytes]]
    ) -> None: ...


@dataclass
class ConsumeStats:
    """What the loop saw: records handed to the sink, and records it could not use."""

    records: int = 0
    undecodable: int = 0
    unmappable: int = 0
    deadlettered: int = 0
    consume_errors: int = 0


def deadletter_headers(msg: Message, reason: str) -> list[tuple[str, bytes]]:
    """Headers of a dead letter of the exporters: the reason and where the original came from."""
    return dead_letter_headers(reason, stage=STAGE, topic=str(msg.topic()),
                               partition=msg.partition(), offset=msg.offset())  # fmt: skip


class ExportLoop:
    """Consume, decode, hand to the sink, commit. See the module doc."""

    def __init__(
        self,
        source: MessageSource,
        sink: Sink,
        *,
        deadletter: DeadLetterSink | None = None,
        decode: Callable[[bytes], tuple[str, dict[str, Any]]] = decode_any,
        batch_size: int = 500,
        log_interval_s: float = 60.0,
    ) -> None:
        self._source = source
        self._sink = sink
        self._deadletter = deadletter
        self._decode = decode
        self._batch_size = batch_size
        self._log_interval_s = log_interval_s
        self._last_log_s = time.monotonic()
        self.stats = ConsumeStats()

    def _reject(self, msg: Message, reason: str) -> None:
        log.warning(
            "skipping record %s[%s]@%s: %s", msg.topic(), msg.partition(), msg.offset(), reason
        )
        if self._deadletter is not None:
            try:
                self._deadletter.send(msg.value(), msg.key(), deadletter_headers(msg, reason))
                self.stats.deadlettered += 1
            except Exception as exc:  # the dead-letter path must never stop the export
                log.error("dead-letter publish failed: %s", exc)

    def handle(self, msg: Message) -> None:
        """Decode one message and hand it to the sink; bad records are counted and rejected."""
        value = msg.value()
        try:
            schema_name, record = self._decode(value or b"")
        except CodecError as exc:
            self.stats.undecodable += 1
            self._reject(msg, f"undecodable: {exc}")
            return
        try:
            self._sink.write(schema_name, record)
        except ExportError as exc:
            self.stats.unmappable += 1
            self._reject(msg, f"unmappable: {exc}")
            return
        self.stats.records += 1

    def run_once(self, timeout_s: float = 1.0) -> int:
        """Consume and handle one batch; returns how many messages it held."""
        messages = self._source.consume(num_messages=self._batch_size, timeout=timeout_s)
        handled = 0
        for msg in messages:
            err = msg.error()
            if err is not None:
                # Partition EOF and unknown-topic-at-start are informational, not data loss.
                self.stats.consume_errors += 1
                log.debug("consumer: %s", err)
                continue
            self.handle(msg)
            handled += 1
        if handled:
            self._source.commit(asynchronous=True)
        now_s = time.monotonic()
        if now_s - self._last_log_s >= self._log_interval_s:
            self._last_log_s = now_s
            log.info("export: %s", self.stats)
        return handled

    def run(self, stop: threading.Event, *, poll_timeout_s: float = 1.0) -> ConsumeStats:
        """Loop until ``stop`` is set; then flush the sink and commit. Returns the stats."""
        try:
            while not stop.is_set():
                self.run_once(poll_timeout_s)
        finally:
            self._sink.flush()
            try:
                self._source.commit(asynchronous=False)
            except Exception as exc:  # nothing consumed yet: no offsets to commit
                log.debug("final commit: %s", exc)
        return self.stats


def kafka_export_loop(
    settings: Any,
    sink: Sink,
    *,
    group_id: str,
    topic_prefix: str = "",
    nic: bool = False,
    **loop_kwargs: Any,
) -> tuple[ExportLoop, Any, KafkaDeadLetter]:
    """An :class:`ExportLoop` on a real cluster: a subscribed consumer and a dead-letter producer.

    ``settings`` is the process's :class:`~peerwatch.settings.KafkaSettings`; ``nic``: read the
    NIC samples too (:func:`export_topics`). Returns the loop,
    the consumer (close it when done) and the dead-letter sink (flush it when done).
    """
    from confluent_kafka import Consumer, Producer

    from peerwatch.kafka_config import consumer_config, producer_config

    consumer = Consumer(consumer_config(settings, group_id))
    consumer.subscribe(export_topics(topic_prefix, nic=nic))
    deadletter = KafkaDeadLetter(
        Producer(producer_config(settings)), deadletter_topic(topic_prefix)
    )
    return ExportLoop(consumer, sink, deadletter=deadletter, **loop_kwargs), consumer, deadletter
