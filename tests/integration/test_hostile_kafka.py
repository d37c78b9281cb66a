"""Hostile messages on a real broker (issue 12): each is dead-lettered with its reason and
counted, and the records around it go on."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from pathlib import Path
from typing import Any

from peerwatch.exporters.consume import deadletter_topic
from peerwatch.io.archive.reader import read_archive
from peerwatch.schemas.codec import AvroCodec
from peerwatch.settings import KafkaSettings
from peerwatch.topic_admin import ensure_topics
from peerwatch.topics import NODE_EVENTS, catalogue
from tests.integration.archive_helpers import peerwatch_env, produce, start, wait_for


def read_raw(kafka: KafkaSettings, topic: str, want: int, timeout_s: float = 30.0
             ) -> list[tuple[bytes | None, dict[str, bytes]]]:  # fmt: skip
    """(value, headers) of the first ``want`` messages of ``topic``."""
    from confluent_kafka import Consumer

    from peerwatch.kafka_config import consumer_config

    consumer = Consumer(consumer_config(kafka, f"raw-{uuid.uuid4().hex[:8]}",
                                        **{"auto.offset.reset": "earliest"}))  # fmt: skip
    consumer.subscribe([topic])
    out: list[tuple[bytes | None, dict[str, bytes]]] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < want and time.monotonic() < deadline:
            for m in consumer.consume(100, timeout=0.5):
                if m.error() is None:
                    out.append((m.value(), dict(m.headers() or [])))
    finally:
        consumer.close()
    return out


def node_event(i: int, ts_ms: int) -> dict[str, Any]:
    return {"event_id": f"ev-{i}", "node": f"gpu{i:05d}", "ts_ms": ts_ms, "state": "IDLE",
            "flags": [], "reason": None, "reason_user": None, "reason_set_ms": None,
            "partitions": None, "source": "WATCHER"}  # fmt: skip


def test_archiver_dead_letters_an_event_time_no_hour_names_and_goes_on(
    kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path
) -> None:
    # Issue 12 item 5: a decodable NodeStateEvent with ts_ms = 2**62 stopped the archiver, and
    # every restart stopped on it again.
    ensure_topics(kafka_settings, catalogue(topic_prefix))
    topic = topic_prefix + NODE_EVENTS.name
    now_ms = int(time.time() * 1000)
    codec = AvroCodec("NodeStateEvent")
    times = [now_ms, now_ms + 1, 2**62, now_ms + 2]
    bad = codec.encode(node_event(2, 2**62))
    msgs = [(topic, b"gpu00000", codec.encode(node_event(i, t)) if t != 2**62 else bad, now_ms)
            for i, t in enumerate(times)]  # fmt: skip
    produce(kafka_settings, msgs)
    root, log = tmp_path / "archive", tmp_path / "archive.log"
    env = peerwatch_env(kafka_settings, topic_prefix)
    args = ["archive", "--dir", str(root), "--group-id", f"{topic_prefix}archive",
            "--flush-records", "1", "--flush-interval-s", "0.2"]  # fmt: skip
    proc = start(args, env, log)
    try:

        def done() -> bool:
            try:
                state = json.loads((root / "_archive_state.json").read_text())
            except (FileNotFoundError, ValueError):
                return False
            return sum(state["offsets"].get(topic, {}).values()) == 4

        wait_for(done, 60, "the archiver to pass all four messages")
        assert proc.poll() is None, log.read_text()[-2000:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    summary = json.loads(log.read_text().strip().splitlines()[-1])
    assert summary["bad_time"] == 1 and summary["records"] == 3
    got = [r["event_id"] for r in read_archive(root, topic, "NodeStateEvent")]
    assert got == ["ev-0", "ev-1", "ev-3"]
    dead = [(v, h) for v, h in read_raw(kafka_settings, deadletter_topic(topic_prefix), 1)]
    assert [v for v, _ in dead] == [bad]
    assert dead[0][1]["peerwatch.reason"].decode().startswith("bad event time")


def test_kafka_replay_counts_each_hostile_message_and_replays_the_rest(
    kafka_settings: KafkaSettings, topic_prefix: str
) -> None:
    # Issue 12 item 4: message boundaries. Each message is one record: an empty value, a
    # tombstone, wrong magic, an unknown fingerprint, a truncated body, two bodies in one
    # message and a header alone are each counted as undecodable; every good sample replays.
    from peerwatch.producers.sim.fleet import Fleet
    from peerwatch.producers.sim.scenario import parse_scenario
    from peerwatch.schemas.codec import HEADER_LEN
    from peerwatch.streams.offline.replay import TimeRange
    from peerwatch.streams.offline.replay_kafka import kafka_records
    from peerwatch.topics import SAMPLES

    ensure_topics(kafka_settings, catalogue(topic_prefix))
    topic = topic_prefix + SAMPLES.name
    now_ms = int(time.time() * 1000)
    start_ms = now_ms - now_ms % 1000 - 120_000
    fleet = Fleet(parse_scenario({
        "fleet": {"nodes": 2, "gpus_per_node": 2, "interval_s": 10.0, "duration_s": 60,
                  "seed": 1, "start_ms": start_ms}, "jobs": [], "faults": []}))  # fmt: skip
    codec = AvroCodec("NodeGpuSample")
    good = [r.value for _, recs in fleet.timed_ticks() for r in recs if r.stream == "samples"]
    body = codec.encode(good[0])
    hostile: list[bytes | None] = [
        b"",  # empty value
        None,  # tombstone
        b"\x00\x01" + body[2:],  # wrong magic
        body[:2] + bytes(8) + body[HEADER_LEN:],  # unknown fingerprint
        body[:-5],  # truncated
        body + body[HEADER_LEN:],  # two bodies in one message
        body[:HEADER_LEN],  # a header alone
    ]
    msgs: list[tuple[str, bytes, Any, int]] = []
    for i, rec in enumerate(good):
        msgs.append((topic, rec["node"].encode(), codec.encode(rec), rec["ts_ms"]))
        if i < len(hostile):
            msgs.append((topic, b"\xff\xfe" if i % 2 else rec["node"].encode(), hostile[i],
                         rec["ts_ms"]))  # fmt: skip
    produce(kafka_settings, msgs)
    span = TimeRange(start_ms, now_ms + 1)
    records, bad = kafka_records(kafka_settings, span, topic_prefix, streams=("samples",))
    assert bad == len(hostile)
    assert sorted((v["node"], v["ts_ms"]) for _, _, v in records) == sorted(
        (r["node"], r["ts_ms"]) for r in good
    )
    # Scoped to one node by key: the hostile messages under a non-UTF-8 key are other nodes'.
    node = good[0]["node"]
    records, bad = kafka_records(kafka_settings, span, topic_prefix, streams=("samples",),
                                 keep_nodes=frozenset({node}))  # fmt: skip
    assert bad == sum(1 for i in range(len(hostile)) if i % 2 == 0 and good[i]["node"] == node)
    assert sorted(v["ts_ms"] for _, _, v in records) == sorted(
        r["ts_ms"] for r in good if r["node"] == node
    )


def test_delivery_worker_restarts_after_an_error_and_delivers(
    kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path
) -> None:
    # Issue 12 item 7: Spool() raised in the worker before its try and the thread died while
    # send() kept queueing. Now the error is logged and counted, the worker restarts, and what
    # was sent meanwhile reaches the broker.
    from peerwatch.producers.delivery import Delivery, DeliverySettings
    from peerwatch.topics import TopicSpec

    topic = TopicSpec(topic_prefix + "delivery.restart", "node", None, 1, "delete", 3_600_000, "t")
    ensure_topics(kafka_settings, [topic])
    blocked = tmp_path / "spool"
    blocked.write_text("not a directory")
    delivery = Delivery(kafka_settings, DeliverySettings(blocked)).start()
    try:
        wait_for(lambda: delivery.stats.worker_errors >= 1, 30, "a worker error")
        for i in range(5):
            delivery.send(topic.name, b"n", b"v%d" % i)
        blocked.unlink()
        wait_for(lambda: delivery.stats.delivered == 5, 60, "delivery after the restart")
    finally:
        stats = delivery.close(10.0)
    assert stats.worker_restarts >= 1 and stats.dropped == 0
    got = read_raw(kafka_settings, topic.name, 5)
    assert [v for v, _ in got] == [b"v%d" % i for i in range(5)]


def test_a_record_over_the_size_limit_is_dead_lettered_and_the_rest_delivered(
    kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path
) -> None:
    # Issue 12 item 8: MSG_SIZE_TOO_LARGE. From the broker (the topic's max.message.bytes, in
    # the delivery report) and from the client (message.max.bytes, raised by produce()): each
    # such record is dead-lettered with the reason and counted, never spooled or retried; the
    # records around it are delivered in order.
    from confluent_kafka.admin import AdminClient, NewTopic

    from peerwatch.kafka_config import admin_config
    from peerwatch.producers.delivery import Delivery, DeliverySettings

    topic, dlq = topic_prefix + "small.limit", topic_prefix + "deadletter"
    admin = AdminClient(admin_config(kafka_settings))
    futures = admin.create_topics([
        NewTopic(topic, 1, 1, config={"max.message.bytes": "2000"}), NewTopic(dlq, 1, 1),
    ])  # fmt: skip
    for f in futures.values():
        f.result(30)
    delivery = Delivery(kafka_settings, DeliverySettings(tmp_path / "spool", deadletter_topic=dlq),
                        **{"message.max.bytes": 20_000}).start()  # fmt: skip
    try:
        # Random bytes: lz4 would shrink repeated ones under the broker's limit.
        values = [b"a" * 100, os.urandom(5_000), b"c" * 100, os.urandom(50_000), b"e" * 100]
        for i, v in enumerate(values):
            delivery.send(topic, b"k%d" % i, v, headers=[("h", b"x")])
        wait_for(lambda: delivery.stats.delivered + delivery.stats.refused == 5, 60, "all five")
    finally:
        stats = delivery.close(10.0)
    assert stats.refused == 2 and stats.delivered == 3 and stats.spooled == 0
    assert delivery.spooled_records == 0 and stats.dropped == 0
    assert [v for v, _ in read_raw(kafka_settings, topic, 3)] == [values[0], values[2], values[4]]
    dead = read_raw(kafka_settings, dlq, 2)
    assert sorted(int(h["peerwatch.size"]) for _, h in dead) == [5_000, 50_000]
    for value, headers in dead:
        assert b"MSG_SIZE_TOO_LARGE" in headers["peerwatch.error"]
        assert headers["peerwatch.topic"] == topic.encode()
        size = int(headers["peerwatch.size"])
        assert value == (values[1] if size == 5_000 else b"")  # 50,000 bytes: no value kept


def test_hot_stage_output_over_the_client_limit_is_dead_lettered(
    kafka_settings: KafkaSettings, topic_prefix: str
) -> None:
    # Issue 12 item 8: produce() raising KafkaException(MSG_SIZE_TOO_LARGE) aborted the rest of
    # the hot stage's batch. Now that record is dead-lettered, counted, and the next one sent.
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from peerwatch.kafka_config import admin_config, producer_config
    from peerwatch.streams.live.counters import StreamCounters
    from peerwatch.streams.live.delivery import OutputDelivery

    out, dlq = topic_prefix + "batches", topic_prefix + "deadletter"
    admin = AdminClient(admin_config(kafka_settings))  # held: its futures need it
    futures = admin.create_topics([NewTopic(out, 1, 1), NewTopic(dlq, 1, 1)])
    for f in futures.values():
        f.result(30)
    counters = StreamCounters()
    hot = OutputDelivery(dlq, counters)
    hot.producer = Producer(producer_config(kafka_settings, **{"message.max.bytes": 10_000}))
    hot.send(out, b"j1", b"small-1")
    hot.send(out, b"j2", os.urandom(50_000))
    hot.send(out, b"j3", b"small-2")
    assert hot.producer.flush(30) == 0
    assert counters.deadletter == 1
    assert [v for v, _ in read_raw(kafka_settings, out, 2)] == [b"small-1", b"small-2"]
    [(value, headers)] = read_raw(kafka_settings, dlq, 1)
    assert value == b"" and headers["peerwatch.size"] == b"50000"
    assert (
        headers["peerwatch.topic"] == out.encode() and headers["peerwatch.reason"] == b"too large"
    )


def test_hot_stage_output_refused_by_the_broker_is_dead_lettered_and_its_batch_kept(
    kafka_settings: KafkaSettings, topic_prefix: str
) -> None:
    # A record over the topic's max.message.bytes (under the client's limit) is refused by the
    # broker in a delivery report, with every record of its produce batch. Those are sent again
    # alone; the one refused alone is dead-lettered and counted, never lost silently.
    from confluent_kafka.admin import AdminClient, NewTopic

    from peerwatch.kafka_config import admin_config
    from peerwatch.streams.live.counters import StreamCounters
    from peerwatch.streams.live.delivery import OutputDelivery

    out, dlq = topic_prefix + "batches", topic_prefix + "deadletter"
    admin = AdminClient(admin_config(kafka_settings))  # held: its futures need it
    futures = admin.create_topics(
        [NewTopic(out, 1, 1, config={"max.message.bytes": "2000"}), NewTopic(dlq, 1, 1)]
    )
    for f in futures.values():
        f.result(30)
    counters = StreamCounters()
    hot = OutputDelivery(dlq, counters)
    from confluent_kafka import Producer

    from peerwatch.kafka_config import producer_config

    hot.producer = Producer(
        producer_config(kafka_settings, **{"linger.ms": 50, "on_delivery": hot.delivered})
    )
    hot.send(out, b"j1", b"small-1")
    hot.send(out, b"j2", os.urandom(5_000))
    hot.send(out, b"j3", b"small-2")
    assert hot.producer.flush(30) == 0
    hot.resend_refused()
    assert hot.producer.flush(30) == 0
    assert (counters.outputs_refused, counters.deadletter, counters.outputs_failed) == (1, 1, 0)
    assert sorted(v for v, _ in read_raw(kafka_settings, out, 2)) == [b"small-1", b"small-2"]
    [(value, headers)] = read_raw(kafka_settings, dlq, 1)
    assert value == b"" and headers["peerwatch.size"] == b"5000"
    assert headers["peerwatch.topic"] == out.encode() and headers["peerwatch.reason"] == b"refused"
    assert hot.undelivered is None
