"""The one bounded topic reader (peerwatch.io.topic_reader) on the real Kafka."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from peerwatch.io.topic_reader import TopicEndNotReached, TopicRange, read_to_end
from peerwatch.kafka_config import consumer_config, producer_config
from peerwatch.settings import KafkaSettings


def _topic(kafka: KafkaSettings, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(30)


def _consumer(kafka: KafkaSettings) -> Consumer:
    return Consumer(consumer_config(kafka, f"reader-test-{time.time_ns()}"))


def test_reads_each_partition_from_a_time_to_its_end_or_past_a_time_bound(
    kafka_settings: KafkaSettings, topic_prefix: str
) -> None:
    topic = topic_prefix + "reader"
    _topic(kafka_settings, topic, 3)
    producer = Producer(producer_config(kafka_settings))
    base = int(time.time() * 1000) - 100_000
    for p in range(3):
        for k in range(10):
            producer.produce(topic, value=f"{p}:{k}".encode(), partition=p,
                             timestamp=base + k * 1000)  # fmt: skip
    assert producer.flush(30) == 0
    consumer = _consumer(kafka_settings)
    try:
        whole = [m.value().decode() for m in read_to_end(consumer, [TopicRange(topic)])]
        assert sorted(whole) == sorted(f"{p}:{k}" for p in range(3) for k in range(10))
        # From the 4th message's time, partitions 0 and 2 only, until a message passes +6 s
        # (that message is the last one read of its partition).
        some = read_to_end(
            consumer, [TopicRange(topic, {0, 2}, from_ms=base + 3000, until_ms=base + 6000)]
        )
        got = sorted(m.value().decode() for m in some)
        assert got == sorted(f"{p}:{k}" for p in (0, 2) for k in range(3, 8))
        # A topic that does not exist reads as empty, beside one that does.
        both = [TopicRange(topic_prefix + "absent"), TopicRange(topic, {1}, from_ms=base + 9000)]
        assert [m.value() for m in read_to_end(consumer, both)] == [b"1:9"]
    finally:
        consumer.close()


def test_a_partition_whose_end_cannot_be_read_ends_the_read_with_the_partition_named(
    kafka_settings: KafkaSettings, topic_prefix: str
) -> None:
    """An aborted transaction leaves a control marker as the partition's last offset: the end
    offset (high watermark) is past every message a consumer is given, so a loop waiting for
    the message at end - 1 would wait for good."""
    topic = topic_prefix + "open-txn"
    _topic(kafka_settings, topic, 1)
    plain = Producer(producer_config(kafka_settings))
    plain.produce(topic, value=b"committed", partition=0)
    assert plain.flush(30) == 0
    txn = Producer({"bootstrap.servers": kafka_settings.bootstrap_servers,
                    "transactional.id": f"{topic_prefix}txn"})  # fmt: skip
    txn.init_transactions(30)
    txn.begin_transaction()
    txn.produce(topic, value=b"aborted", partition=0)
    assert txn.flush(30) == 0
    txn.abort_transaction(30)
    consumer = _consumer(kafka_settings)
    got: list[bytes] = []
    try:
        with pytest.raises(TopicEndNotReached, match=rf"{topic}\[0\]") as raised:
            for msg in read_to_end(consumer, [TopicRange(topic)], idle_timeout_s=2):
                got.append(msg.value())
        assert raised.value.open_partitions == {(topic, 0)}
        assert got[0] == b"committed"  # what was read before stays with the caller
    finally:
        consumer.close()
