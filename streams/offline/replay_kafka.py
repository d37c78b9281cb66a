"""Read a time range of the input topics from Kafka for :mod:`peerwatch.streams.offline.replay`.

Each partition starts at ``offsets_for_times(from)`` (job events at ``from - lookback``) and is read
up to its end offset as of the start of the replay, stopping early once message timestamps are
``slack_ms`` past ``to`` (producers stamp messages with the event time; the slack covers clock
skew). No consumer group offsets are committed: a replay changes nothing on the cluster.
Memory: the whole range is held to be sorted (an incident-sized range, not a month).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from peerwatch.errors import CodecError
from peerwatch.io.archive.layout import record_time_ms
from peerwatch.schemas.codec import AvroCodec
from peerwatch.streams.offline.replay import (
    INPUT_STREAMS,
    Record,
    TimeRange,
    bulk_load,
    sort_records,
)

log = logging.getLogger(__name__)
#: Undecodable messages logged one by one (then a total).
_LOGGED = 20


def range_messages(
    kafka_settings: Any,
    span: TimeRange,
    topic_prefix: str = "",
    *,
    slack_ms: int = 300_000,
    timeout_s: float = 30.0,
    streams: tuple[str, ...] | None = None,
) -> Iterator[tuple[str, Any]]:
    """``(stream, message)`` of every message of the input topics in ``span`` (job events from
    the lookback), partition by partition as they come. Raises
    confluent_kafka.KafkaException when the cluster does not answer, and
    :class:`~peerwatch.io.topic_reader.TopicEndNotReached` when it stops answering (no message
    for ``timeout_s`` with partitions still open)."""
    from confluent_kafka import Consumer

    from peerwatch.io.topic_reader import TopicRange, read_to_end
    from peerwatch.kafka_config import consumer_config

    stream_of: dict[str, str] = {}
    ranges = []
    for stream, spec in INPUT_STREAMS.items():
        if streams is not None and stream not in streams:
            continue
        topic = topic_prefix + spec.name
        stream_of[topic] = stream
        start = span.from_ms - (span.lookback_ms if stream == "job-events" else 0)
        ranges.append(TopicRange(topic, from_ms=start, until_ms=span.to_ms + slack_ms))
    consumer = Consumer(consumer_config(kafka_settings, f"peerwatch-replay-{uuid.uuid4().hex[:8]}"))
    try:
        for msg in read_to_end(consumer, ranges, idle_timeout_s=timeout_s,
                               metadata_timeout_s=timeout_s):  # fmt: skip
            yield stream_of[str(msg.topic())], msg
    finally:
        consumer.close()


def message_records(
    messages: Iterable[tuple[str, Any]], keep_nodes: frozenset[str] | None = None
) -> tuple[list[tuple[str, dict[str, Any]]], int]:
    """The (stream, record) of each (stream, message) consumed, and how many messages could not
    be decoded (skipped, each logged up to a point). ``keep_nodes``: see :func:`kafka_records`."""
    codecs = {stream: AvroCodec(str(spec.value_schema)) for stream, spec in INPUT_STREAMS.items()}
    keep_keys = None if keep_nodes is None else {n.encode() for n in keep_nodes}
    pairs: list[tuple[str, dict[str, Any]]] = []
    bad = 0
    for stream, msg in messages:
        if keep_keys is not None and stream == "samples" and msg.key() not in keep_keys:
            continue
        try:
            pairs.append((stream, codecs[stream].decode(msg.value() or b"")))
        except CodecError as exc:  # one message, one record: the next message is read as usual
            bad += 1
            if bad <= _LOGGED:
                log.warning("replay: skipping %s[%s]@%s: %s", msg.topic(), msg.partition(),
                            msg.offset(), exc)  # fmt: skip
    if bad > _LOGGED:
        log.warning("replay: %d undecodable messages skipped in all", bad)
    return pairs, bad


@bulk_load()  # decoded records pile up: the cyclic collector is held off (see bulk_load)
def kafka_records(
    kafka_settings: Any,
    span: TimeRange,
    topic_prefix: str = "",
    *,
    slack_ms: int = 300_000,
    timeout_s: float = 30.0,
    streams: tuple[str, ...] | None = None,
    keep_nodes: frozenset[str] | None = None,
) -> tuple[list[Record], int]:
    """The input records of ``span`` in replay order, and how many messages could not be
    decoded (skipped, each logged up to a point: empty, wrong magic, unknown fingerprint,
    truncated, trailing bytes after the record). ``streams`` limits the input streams read; ``keep_nodes`` skips, by
    message key and undecoded, the samples of other nodes (see ``replay.scope_nodes``). Raises
    confluent_kafka.KafkaException when the cluster does not answer."""
    messages = range_messages(
        kafka_settings, span, topic_prefix, slack_ms=slack_ms, timeout_s=timeout_s, streams=streams
    )
    pairs, bad = message_records(messages, keep_nodes)
    return sort_records((s, v) for s, v in pairs if span.admits(s, record_time_ms(v))), bad
