"""``peerwatch export alertmanager``: the thin edges around :mod:`peerwatch.exporters.alerts`.

* :class:`AlertmanagerClient` POSTs alerts to ``/api/v2/alerts`` (httpx, one deadline for the
  whole request, the answer read up to a bound); any failure is a
  :class:`~peerwatch.errors.ServiceError`.
* :class:`AlertSender` sends what the :class:`~peerwatch.exporters.alerts.AlertBook` says is
  due; while Alertmanager fails it keeps the alerts and retries with exponential backoff (capped
  at ``retry_max_s``), logging each failure: the loop never blocks on it and never dies of it.
* :class:`AlertSink` is the exporter :class:`~peerwatch.exporters.base.Sink` feeding the book.
* :class:`ReplayProgress` and :func:`run_alert_export`: on start the findings, recommendations
  and job-events topics are read from ``lookback_s`` ago (no committed offsets), so the book is
  rebuilt from the topics; nothing is sent until the replay reached the end offsets seen at
  start. The alerts then sent carry the labels they had before the restart, so Alertmanager
  merges them into the alerts it holds and notifies nobody again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from peerwatch.clock import SYSTEM_CLOCK, Clock
from peerwatch.errors import ServiceError
from peerwatch.exporters.alerts import AlertBook, BadAlertRecord, to_api
from peerwatch.exporters.base import ExportError
from peerwatch.exporters.consume import ExportLoop, MessageSource, deadletter_topic
from peerwatch.settings import AlertmanagerSettings
from peerwatch.topics import JOB_EVENTS, RECOMMENDATIONS, STRAGGLERS

log = logging.getLogger(__name__)

#: How long the start-up assignment retries a broker that is not ready yet (s).
ASSIGN_RETRY_S = 60.0


def _not_ready_codes() -> frozenset[int]:
    from confluent_kafka import KafkaError

    return frozenset({
        KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.REQUEST_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
        KafkaError._WAIT_COORD,
    })  # fmt: skip


_NOT_READY_CODES = _not_ready_codes()

ALERT_TOPICS = (STRAGGLERS, RECOMMENDATIONS, JOB_EVENTS)
#: Alerts per POST (Alertmanager takes any number; smaller bodies fail and retry cheaper).
POST_BATCH = 500
FIRST_RETRY_S = 0.5
#: Most bytes of Alertmanager's answer read (it answers a POST with a few bytes of JSON).
MAX_ANSWER_BYTES = 64 * 1024


def alert_topics(prefix: str = "") -> list[str]:
    return [prefix + t.name for t in ALERT_TOPICS]


class AlertmanagerClient:
    """``POST {url}/api/v2/alerts`` with httpx, bounded in time and memory whatever answers.

    Every request gets one deadline of ``timeout_s`` for all of it (connect, send, the answer's
    headers and body): httpx's own timeouts apply per network operation, so a peer answering
    one byte a second would never trip them; ``asyncio.timeout`` around the whole exchange does.
    The answer's body is read up to :data:`MAX_ANSWER_BYTES` and no further. ``transport`` is
    an httpx async transport (tests inject ``httpx.MockTransport``)."""

    def __init__(
        self,
        url: str,
        timeout_s: float,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._transport = transport

    def post_alerts(self, alerts: Sequence[Mapping[str, Any]]) -> None:
        """Send ``alerts`` (v2 JSON) within ``timeout_s`` seconds. Raises ServiceError for any
        failure: refused, timed out, an answer that is not HTTP or is too large, or not 2xx."""
        body = json.dumps(list(alerts)).encode()
        try:
            status, answer = asyncio.run(self._post(body))
        except TimeoutError as exc:
            raise ServiceError(
                f"Alertmanager {self.url} unreachable: no complete answer within "
                f"{self.timeout_s:g} s"
            ) from exc
        except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
            raise ServiceError(
                f"Alertmanager {self.url} unreachable: {type(exc).__name__}: {exc}"
            ) from exc
        if not 200 <= status < 300:
            detail = answer[:300].decode(errors="replace")
            raise ServiceError(f"Alertmanager {self.url} answered {status}: {detail}")

    async def _post(self, body: bytes) -> tuple[int, bytes]:
        """The status and at most :data:`MAX_ANSWER_BYTES` of the answer. Raises TimeoutError
        past the deadline, httpx errors for what is not a valid HTTP answer, ServiceError for an
        answer larger than the bound."""
        async with asyncio.timeout(self.timeout_s):
            async with (
                httpx.AsyncClient(transport=self._transport, timeout=self.timeout_s) as client,
                client.stream(
                    "POST",
                    f"{self.url}/api/v2/alerts",
                    content=body,
                    headers={"Content-Type": "application/json"},
                ) as response,
            ):
                answer = bytearray()
                async for chunk in response.aiter_raw():
                    answer += chunk
                    if len(answer) > MAX_ANSWER_BYTES:
                        raise ServiceError(
                            f"Alertmanager {self.url} answered {response.status_code} with "
                            f"more than {MAX_ANSWER_BYTES} bytes (not read further)"
                        )
                return response.status_code, bytes(answer)


@dataclass
class SendStats:
    posts: int = 0
    alerts_sent: int = 0
    failures: int = 0


class AlertSender:
    """Sends the book's due alerts; on failure backs off (module doc)."""

    def __init__(
        self,
        book: AlertBook,
        client: AlertmanagerClient,
        *,
        retry_max_s: float,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.book = book
        self.client = client
        self.retry_max_s = retry_max_s
        self.clock = clock
        self.stats = SendStats()
        self._retry_s = 0.0
        self._next_try_s = 0.0

    def tick(self) -> int:
        """Send what is due (unless backing off); returns how many alerts were sent."""
        if self.clock.monotonic_s() < self._next_try_s:
            return 0
        now_ms = self.clock.now_ms()
        due = self.book.due(now_ms)
        if not due:
            return 0
        payload = [to_api(a, now_ms, self.book.resend_ms) for a in due]
        sent = 0
        try:
            for i in range(0, len(due), POST_BATCH):
                self.client.post_alerts(payload[i : i + POST_BATCH])
                self.book.mark_sent(due[i : i + POST_BATCH], now_ms)
                self.stats.posts += 1
                sent += len(payload[i : i + POST_BATCH])
        except Exception as exc:
            # ServiceError is every failure the client knows; anything else is a client fault,
            # logged with its traceback, but retried all the same: the loop must not die of it.
            self.stats.failures += 1
            self._retry_s = min(self.retry_max_s, max(FIRST_RETRY_S, 2 * self._retry_s))
            self._next_try_s = self.clock.monotonic_s() + self._retry_s
            log.warning("%s; %d alerts kept, retry in %.1f s", exc, len(due) - sent, self._retry_s,
                        exc_info=not isinstance(exc, ServiceError))  # fmt: skip
        else:
            if self._retry_s:
                log.info("Alertmanager %s answers again", self.client.url)
            self._retry_s = 0.0
        self.stats.alerts_sent += sent
        return sent


class AlertSink:
    """The exporter Sink: decoded records into the book (a record it cannot use is an
    ExportError, which the consume loop dead-letters)."""

    def __init__(self, book: AlertBook) -> None:
        self.book = book

    def write(self, schema_name: str, record: Mapping[str, Any]) -> None:
        try:
            self.book.apply(schema_name, record)
        except (BadAlertRecord, KeyError, TypeError, ValueError) as exc:
            raise ExportError(f"{schema_name}: {exc}") from exc

    def flush(self, timeout_s: float = 10.0) -> bool:
        return True

    def close(self) -> None:
        pass


@dataclass
class ReplayProgress:
    """End offsets seen at start, per (topic, partition); caught up once every partition's
    position reached its end offset."""

    ends: dict[tuple[str, int], int] = field(default_factory=dict)
    done: bool = False

    def check(self, positions: Mapping[tuple[str, int], int]) -> bool:
        if not self.done:
            self.done = all(positions.get(tp, -1) >= end for tp, end in self.ends.items())
        return self.done


def book_for(settings: AlertmanagerSettings) -> AlertBook:
    return AlertBook(
        finding_ttl_ms=round(settings.finding_ttl_s * 1000),
        resend_ms=round(settings.resend_s * 1000),
        resolved_retention_ms=round(settings.resolved_retention_s * 1000),
        max_alerts=settings.max_alerts,
    )


def assign_from(consumer: Any, topics: list[str], since_ms: int) -> ReplayProgress:
    """Assign every partition of ``topics`` at its first record stamped at or after ``since_ms``
    (Kafka record timestamps); returns the end offsets to reach. Raises ServiceError for a
    missing topic.

    The end offsets are read before the time lookup: a partition with no record since
    ``since_ms`` starts at that end offset, so a record produced meanwhile is read, not skipped
    (as starting at "the end" would)."""
    import time

    from confluent_kafka import KafkaError, KafkaException

    # A broker still electing leaders (just after the topics were created, or a restart)
    # answers NOT_LEADER and the like for a while: retriable errors are retried for a minute.
    deadline_s = time.monotonic() + ASSIGN_RETRY_S
    wait_s = 0.2
    while True:
        try:
            return _assign_from(consumer, topics, since_ms)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            retriable = isinstance(err, KafkaError) and (
                err.retriable() or err.code() in _NOT_READY_CODES
            )
            if not retriable or time.monotonic() + wait_s > deadline_s:
                raise ServiceError(f"Kafka: cannot assign the alert topics: {exc}") from exc
            log.info("Kafka not ready for the alert topics (%s); retrying in %.1f s", exc, wait_s)
            time.sleep(wait_s)
            wait_s = min(wait_s * 2, 5.0)


def _assign_from(consumer: Any, topics: list[str], since_ms: int) -> ReplayProgress:
    from confluent_kafka import TopicPartition

    metadata = consumer.list_topics(timeout=10)
    wanted: list[TopicPartition] = []
    for topic in topics:
        meta = metadata.topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise ServiceError(f"topic {topic} does not exist (create it: peerwatch topics create)")
        wanted += [TopicPartition(topic, p, since_ms) for p in sorted(meta.partitions)]
    highs = {
        (tp.topic, tp.partition): consumer.get_watermark_offsets(
            TopicPartition(tp.topic, tp.partition), timeout=10
        )[1]
        for tp in wanted
    }
    progress = ReplayProgress()
    assignment = []
    for tp in consumer.offsets_for_times(wanted, timeout=10):
        high = highs[(tp.topic, tp.partition)]
        start = tp.offset if 0 <= tp.offset < high else high
        assignment.append(TopicPartition(tp.topic, tp.partition, start))
        if start < high:
            progress.ends[(tp.topic, tp.partition)] = high
    consumer.assign(assignment)
    return progress


class _NoCommit:
    """The consumer as the ExportLoop's source, without commits: state comes from replay."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer

    def consume(self, num_messages: int = 1, timeout: float = -1) -> Sequence[Any]:
        messages: Sequence[Any] = self._consumer.consume(num_messages, timeout)
        return messages

    def commit(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        self._consumer.close()


def positions(consumer: Any, progress: ReplayProgress) -> dict[tuple[str, int], int]:
    from confluent_kafka import TopicPartition

    parts = [TopicPartition(t, p) for t, p in progress.ends]
    return {(tp.topic, tp.partition): tp.offset for tp in consumer.position(parts)}


def run_alert_export(
    loop: ExportLoop,
    consumer: Any,
    progress: ReplayProgress,
    sender: AlertSender,
    stop: threading.Event,
    *,
    poll_timeout_s: float = 0.5,
) -> None:
    """Consume into the book; once the replay caught up, send what is due after every batch
    (at least every ``poll_timeout_s``). Returns when ``stop`` is set."""
    replayed = False
    while not stop.is_set():
        loop.run_once(poll_timeout_s)
        if not progress.check(positions(consumer, progress)):
            # End what ran out meanwhile, as it would have ended live: keeps the book small.
            sender.book.expire(sender.clock.now_ms())
            continue
        if not replayed:
            replayed = True
            log.info(
                "replay caught up after %d records: %d alerts firing, %d held",
                loop.stats.records,
                len(sender.book.firing()),
                len(sender.book.alerts),
            )
        sender.tick()


def kafka_alert_export(
    kafka: Any,
    settings: AlertmanagerSettings,
    *,
    group_id: str,
    topic_prefix: str = "",
    clock: Clock = SYSTEM_CLOCK,
) -> tuple[ExportLoop, Any, ReplayProgress, AlertSender, Any]:
    """The wired exporter on a real cluster: (loop, consumer, progress, sender, dead letters).
    ``kafka`` is the process's KafkaSettings."""
    from confluent_kafka import Consumer, Producer

    from peerwatch.io.deadletter import KafkaDeadLetter
    from peerwatch.kafka_config import consumer_config, producer_config

    book = book_for(settings)
    consumer = Consumer(consumer_config(kafka, group_id))
    since_ms = clock.now_ms() - round(settings.lookback_s * 1000)
    progress = assign_from(consumer, alert_topics(topic_prefix), since_ms)
    deadletter = KafkaDeadLetter(Producer(producer_config(kafka)), deadletter_topic(topic_prefix))
    source: MessageSource = _NoCommit(consumer)
    loop = ExportLoop(source, AlertSink(book), deadletter=deadletter)
    client = AlertmanagerClient(settings.url, settings.timeout_s)
    sender = AlertSender(book, client, retry_max_s=settings.retry_max_s, clock=clock)
    return loop, consumer, progress, sender, deadletter
