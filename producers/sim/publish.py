"""Drive a simulated fleet into a record sink: Kafka (the producers' own delivery path) or Avro
archive files, paced to a target rate of node records per second."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from peerwatch.producers.sim.fleet import Fleet
from peerwatch.schemas.codec import AvroCodec
from peerwatch.topics import JOB_EVENTS, NIC_SAMPLES, NODE_EVENTS, SAMPLES, STEP_TIMES, TopicSpec

#: Simulator stream -> catalogue topic.
STREAM_TOPICS: dict[str, TopicSpec] = {
    "samples": SAMPLES,
    "job-events": JOB_EVENTS,
    "node-events": NODE_EVENTS,
    "step-times": STEP_TIMES,
    "nic-samples": NIC_SAMPLES,
}


class BytesSink(Protocol):
    def send(
        self, topic: str, key: bytes | None, value: bytes, headers: tuple[()] = (), ts_ms: int = 0
    ) -> None: ...


class RecordSink(Protocol):
    def write(self, topic: str, record: dict, ts_ms: int) -> None: ...  # type: ignore[type-arg]


@dataclass
class PublishStats:
    node_records: int = 0
    records: int = 0
    wall_s: float = 0.0
    sim_end_ms: int = 0

    @property
    def node_records_per_s(self) -> float:
        return self.node_records / self.wall_s if self.wall_s else 0.0


def _pace(stats: PublishStats, rate: float, start: float) -> None:
    if rate > 0:
        ahead_s = stats.node_records / rate - (time.perf_counter() - start)
        if ahead_s > 0:
            time.sleep(ahead_s)


def publish_to_kafka(
    fleet: Fleet,
    sink: BytesSink,
    topic_prefix: str = "",
    rate: float = 0.0,
    stop: threading.Event | None = None,
    on_tick: Callable[[int, PublishStats], None] | None = None,
) -> PublishStats:
    """Encode every record of ``fleet`` (Avro single-object) and send it; ``rate`` in node records/s
    (0 = as fast as possible)."""
    codecs = {s: AvroCodec(t.value_schema or "") for s, t in STREAM_TOPICS.items()}
    topics = {s: topic_prefix + t.name for s, t in STREAM_TOPICS.items()}
    stats = PublishStats()
    start = time.perf_counter()
    for tick_ms, records in fleet.timed_ticks():
        for rec in records:
            value = codecs[rec.stream].encode(rec.value)
            sink.send(
                topics[rec.stream], rec.key.encode(), value, (), rec.value.get("ts_ms", tick_ms)
            )
            stats.records += 1
            if rec.stream == "samples":
                stats.node_records += 1
        stats.sim_end_ms = tick_ms
        if on_tick is not None:
            on_tick(tick_ms, stats)
        if stop is not None and stop.is_set():
            break
        _pace(stats, rate, start)
    stats.wall_s = time.perf_counter() - start
    return stats


def write_archive(
    fleet: Fleet,
    root: Path,
    topic_prefix: str = "",
    on_tick: Callable[[int, PublishStats], None] | None = None,
) -> PublishStats:
    """Write every record to Avro container files under ``root`` plus ``labels.jsonl``; no Kafka.
    ``on_tick`` is called after each tick with its time (epoch ms) and the counts so far."""
    from peerwatch.io.archive.writer import AvroFileSink

    topics = {s: topic_prefix + t.name for s, t in STREAM_TOPICS.items()}
    sink = AvroFileSink(root, {topics[s]: t.value_schema or "" for s, t in STREAM_TOPICS.items()})
    stats = PublishStats()
    start = time.perf_counter()
    try:
        for tick_ms, records in fleet.timed_ticks():
            for rec in records:
                sink.write(topics[rec.stream], rec.value, rec.value.get("ts_ms", tick_ms))
                stats.records += 1
                stats.node_records += rec.stream == "samples"
            stats.sim_end_ms = tick_ms
            if on_tick is not None:
                on_tick(tick_ms, stats)
    finally:
        sink.close()
    with (Path(root) / "labels.jsonl").open("w") as fh:
        for label in fleet.labels():
            fh.write(json.dumps(label, sort_keys=True) + "\n")
    stats.wall_s = time.perf_counter() - start
    return stats
