"""Per topic of one prefix on a broker: records, bytes as produced (key + value, uncompressed)
and bytes on the broker's disk (the log segments: compressed as produced, lz4, with Kafka's
record-batch overhead), per record. The figures behind docs/sizing.md.

    PYTHONPATH=. python scripts/measure_topic_sizes.py --prefix P --log-dir KAFKA_LOG_DIR

(after `peerwatch bench stream ... --keep-topics`, which names its prefix). Reads every record
of the prefix's topics from the start; prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import uuid
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition

from peerwatch.kafka_config import consumer_config
from peerwatch.settings import load_settings


def on_disk(log_dir: Path, topic: str) -> int:
    """Bytes of the topic's log segments (``<topic>-<partition>/*.log``)."""
    return sum(
        f.stat().st_size
        for d in log_dir.glob(f"{topic}-*")
        if d.name.rpartition("-")[0] == topic and d.name.rpartition("-")[2].isdigit()
        for f in d.glob("*.log")
    )


def measure(prefix: str, log_dir: Path) -> dict[str, dict[str, float]]:
    kafka = load_settings().kafka
    consumer = Consumer(consumer_config(kafka, f"measure-{uuid.uuid4().hex}"))
    try:
        topics = sorted(t for t in consumer.list_topics(timeout=10).topics if t.startswith(prefix))
        out: dict[str, dict[str, float]] = {}
        for topic in topics:
            meta = consumer.list_topics(topic, timeout=10).topics[topic]
            parts = [TopicPartition(topic, p, 0) for p in sorted(meta.partitions)]
            ends = {p.partition: consumer.get_watermark_offsets(p, timeout=10)[1] for p in parts}
            consumer.assign(parts)
            records, raw, done = 0, 0, {p for p, end in ends.items() if end == 0}
            while len(done) < len(ends):
                for msg in consumer.consume(1000, timeout=1.0):
                    if msg.error() is not None:
                        continue
                    records += 1
                    raw += len(msg.value() or b"") + len(msg.key() or b"")
                    if msg.offset() + 1 >= ends[msg.partition()]:
                        done.add(msg.partition())
            disk = on_disk(log_dir, topic)
            out[topic.removeprefix(prefix)] = {
                "records": records,
                "raw_bytes": raw,
                "disk_bytes": disk,
                "raw_per_record": round(raw / records, 1) if records else 0,
                "disk_per_record": round(disk / records, 1) if records else 0,
            }
        return out
    finally:
        consumer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prefix", required=True, help="topic prefix of the run")
    parser.add_argument("--log-dir", type=Path, required=True, help="the broker's log.dirs")
    args = parser.parse_args()
    print(json.dumps(measure(args.prefix, args.log_dir), indent=1))


if __name__ == "__main__":
    main()
