"""The broker goes away mid-run and comes back: every record of every node arrives exactly once, in order.

This test needs a broker it may stop, so it starts its own real Kafka (never the shared one)."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from peerwatch.kafka_config import consumer_config
from peerwatch.local.kafka import LocalKafka
from peerwatch.producers.delivery import Delivery, DeliverySettings
from peerwatch.settings import KafkaSettings, expand
from peerwatch.topic_admin import ensure_topics
from peerwatch.topics import TopicSpec


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


NODES = [f"gpu{i:03d}" for i in range(6)]
#: Tells "returned at once" from "blocked on Kafka"; not a speed budget.
SEND_BLOCKED_S = 2.0


def consume_all(settings: KafkaSettings, topic: str, partitions: int) -> list[tuple[str, int]]:
    consumer = Consumer(consumer_config(settings, group_id=f"check-{time.time_ns()}"))
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    out: list[tuple[str, int]] = []
    idle_since = time.monotonic()
    while time.monotonic() - idle_since < 5:
        msgs = consumer.consume(1000, timeout=0.5)
        if msgs:
            idle_since = time.monotonic()
        for m in msgs:
            assert m.error() is None, m.error()
            node, seq = m.value().decode().split(":")
            assert m.key().decode() == node
            out.append((node, int(seq)))
    consumer.close()
    return out


def test_outage_loses_nothing_and_duplicates_nothing(tmp_path: Path) -> None:
    kafka = LocalKafka(
        cache_dir=expand(os.environ.get("PEERWATCH_CACHE_DIR", "~/.cache/peerwatch")),
        state_dir=tmp_path / "kafka",
        port=free_port(),
        controller_port=free_port(),
    )
    kafka.start()
    try:
        settings = KafkaSettings(bootstrap_servers=kafka.bootstrap, client_id="outage-test")
        topic = TopicSpec("outage.samples", "node", None, 4, "delete", 3_600_000, "test")
        ensure_topics(settings, [topic])
        delivery = Delivery(
            settings,
            DeliverySettings(spool_dir=tmp_path / "spool", retry_interval_s=0.5),
        ).start()
        seq = dict.fromkeys(NODES, 0)
        max_send_s = 0.0

        def tick() -> None:
            nonlocal max_send_s
            for node in NODES:
                t0 = time.perf_counter()
                delivery.send(topic.name, node.encode(), f"{node}:{seq[node]}".encode())
                max_send_s = max(max_send_s, time.perf_counter() - t0)
                seq[node] += 1
            time.sleep(0.02)

        for _ in range(50):
            tick()
        assert kafka.stop() in ("stopped", "killed")
        # At least 8 s of outage; longer (up to 120 s: a bound, not a budget) until librdkafka
        # has reported every broker down and records went to the spool (slow on a loaded
        # machine): the spool must really be exercised.
        outage_start = time.monotonic()
        while True:
            tick()
            elapsed = time.monotonic() - outage_start
            if elapsed >= 120 or (
                elapsed >= 8 and delivery.spooling and delivery.spooled_records > 0
            ):
                break
        assert delivery.spooling, (
            f"the outage must have switched delivery to the spool: {delivery.stats}, "
            f"last error {delivery.last_error}"
        )
        assert delivery.spooled_records > 0
        kafka.start()
        for _ in range(100):
            tick()
        deadline = time.monotonic() + 60
        while (delivery.spooling or delivery.spooled_records) and time.monotonic() < deadline:
            time.sleep(0.2)
        stats = delivery.close(timeout_s=20)
        assert delivery.spooled_records == 0
        assert stats.dropped == 0
        assert stats.spooled > 0 and stats.replayed == stats.spooled

        got = consume_all(settings, topic.name, topic.partitions)
        for node in NODES:
            seqs = [s for n, s in got if n == node]
            assert seqs == list(range(seq[node])), f"{node}: gap, duplicate or reorder: {seqs}"
        # Not a speed budget (a loaded machine stretches any call): a send() that waited on the
        # unreachable broker would take librdkafka's timeouts (seconds to minutes).
        assert max_send_s < SEND_BLOCKED_S, f"send() blocked for {max_send_s:.3f} s"
    finally:
        kafka.stop()
