"""The settings a stream worker runs with, published for replay (topic
``peerwatch.stream.settings``, compacted, JSON).

``peerwatch stream`` publishes one record when a worker starts: its ``[stream]``, ``[detector]``
and ``[policy]`` tables, keyed ``<app_id>|<started_ms>``. ``peerwatch replay`` reads them and, by
default for Kafka replays, runs with the record of the same app that was live at the start of its
range (the newest with ``effective_from_ms <= from``), so a replay reproduces what the worker did
even after the config file changed. The start is wall-clock time, which a live worker's event
time follows (a worker started on a backlog applied its settings to older samples too).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from peerwatch.settings import KafkaSettings, Settings, from_tree
from peerwatch.topics import STREAM_SETTINGS

log = logging.getLogger(__name__)
#: The tables a worker publishes: everything that shapes its outputs.
PUBLISHED_TABLES = ("stream", "detector", "policy")


def settings_record(settings: Settings, started_ms: int) -> tuple[bytes, bytes]:
    """Key and JSON value of the record a worker started at ``started_ms`` publishes."""
    body = {t: getattr(settings, t).to_dict() for t in PUBLISHED_TABLES}
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    app_id = settings.stream.app_id
    value = {"app_id": app_id, "effective_from_ms": started_ms, "digest": digest, **body}
    return f"{app_id}|{started_ms}".encode(), json.dumps(value, sort_keys=True).encode()


def publish_settings(
    settings: Settings,
    started_ms: int,
    producer_factory: Callable[[dict[str, Any]], Any] | None = None,
) -> None:
    """Publish the worker's settings record; waits up to 10 s for delivery (a worker whose
    settings cannot be published still runs: replay then falls back to its config)."""
    from peerwatch.kafka_config import producer_config

    if producer_factory is None:
        from confluent_kafka import Producer

        producer_factory = Producer
    key, value = settings_record(settings, started_ms)
    producer = producer_factory(producer_config(settings.kafka))
    producer.produce(settings.topic_prefix + STREAM_SETTINGS.name, key=key, value=value)
    if producer.flush(10.0):
        log.warning("stream: the settings record was not delivered within 10 s")


def settings_at(
    records: Iterable[Mapping[str, Any]], app_id: str, ts_ms: int
) -> Mapping[str, Any] | None:
    """The record of ``app_id`` live at ``ts_ms``: the newest with ``effective_from_ms <= ts_ms``
    (None when the app published none that early)."""
    live = [
        r for r in records
        if r.get("app_id") == app_id and isinstance(r.get("effective_from_ms"), int)
        and r["effective_from_ms"] <= ts_ms
    ]  # fmt: skip
    return max(live, key=lambda r: r["effective_from_ms"]) if live else None


def with_published(settings: Settings, record: Mapping[str, Any]) -> Settings:
    """``settings`` with the published tables of ``record``. Raises ConfigError for a record
    this version cannot read (an unknown or bad setting, named)."""
    return from_tree({t: record[t] for t in PUBLISHED_TABLES if t in record}, settings)


def read_published(
    kafka: KafkaSettings, topic: str, timeout_s: float = 10.0
) -> list[dict[str, Any]]:
    """Every settings record of ``topic`` (a small compacted topic, read whole); records that
    are not JSON objects are skipped. Raises confluent_kafka.KafkaException when Kafka does not
    answer."""
    import uuid

    from confluent_kafka import Consumer

    from peerwatch.io.topic_reader import TopicEndNotReached, TopicRange, read_to_end
    from peerwatch.kafka_config import consumer_config

    consumer = Consumer(consumer_config(kafka, f"peerwatch-replay-{uuid.uuid4().hex[:8]}"))
    out: list[dict[str, Any]] = []
    try:
        for msg in read_to_end(consumer, [TopicRange(topic)], idle_timeout_s=timeout_s,
                               metadata_timeout_s=timeout_s):  # fmt: skip
            out.extend(published_records([msg.value()]))
    except TopicEndNotReached:
        pass  # nothing more within the timeout: use what was read
    finally:
        consumer.close()
    return out


def published_records(values: Iterable[bytes | None]) -> list[dict[str, Any]]:
    """The settings records among message values: those that are JSON objects (anything else,
    even JSON nested too deep to read, is skipped)."""
    from peerwatch.streams.live.handlers import json_object

    out = []
    for value in values:
        try:
            out.append(json_object(value or b""))
        except (ValueError, TypeError):
            continue
    return out


def live_settings(
    tree: Settings, records: Iterable[Mapping[str, Any]], ts_ms: int
) -> tuple[Settings, str | None]:
    """``tree`` with the published tables of the record of its app live at ``ts_ms``, and what
    the replay reports about it (None, and ``tree`` itself, when none was published that early).
    Raises ConfigError for a record this version cannot read (the bad setting named)."""
    record = settings_at(records, tree.stream.app_id, ts_ms)
    if record is None:
        return tree, None
    return with_published(tree, record), (
        f"live {record.get('digest')} from {record['effective_from_ms']}"
    )
