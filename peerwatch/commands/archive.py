"""``peerwatch archive --dir DIR`` — archive the input and output topics into Avro container
files per topic and hour (crash-safe, see :mod:`peerwatch.exporters.archive`). Runs until
SIGTERM/SIGINT, then commits and exits; a SIGKILL loses nothing (the next start recovers)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
from typing import Any

from peerwatch.commands import settings_of
from peerwatch.output_paths import check_output_dir

log = logging.getLogger(__name__)


def register(sub: Any) -> None:
    p = sub.add_parser("archive", help="archive the topics into Avro files per topic and hour")
    p.add_argument("--dir", required=True, help="archive directory (one archiver per directory)")
    p.add_argument("--group-id", default="peerwatch-archive", help="consumer group")
    p.add_argument("--flush-interval-s", type=float, default=5.0,
                   help="commit (fsync + offsets) at least this often")  # fmt: skip
    p.add_argument("--flush-records", type=int, default=20_000,
                   help="commit after this many records")  # fmt: skip
    p.add_argument("--rotate-after-s", type=float, default=600.0,
                   help="close an hour's file this long after the hour ended (event time)")  # fmt: skip
    p.add_argument("--retention-days", type=float, default=0.0,
                   help="delete closed files older than this (0 = keep)")  # fmt: skip
    p.add_argument("--codec", default="zstandard", choices=["zstandard", "deflate", "null"])
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from peerwatch.exporters.archive import ArchiveSettings, ArchiveWriter
    from peerwatch.exporters.archive_loop import ArchiveLoop, KafkaArchiveSource, archived_topics
    from peerwatch.topic_admin import ensure_topics
    from peerwatch.topics import catalogue

    if args.codec == "zstandard":
        # fastavro's zstandard codec needs it at the first block: fail before any work if the
        # archive extra is not installed (the CLI names the extra).
        import zstandard  # noqa: F401

    settings = settings_of(args)
    archive = ArchiveSettings(
        codec=args.codec,
        flush_interval_s=args.flush_interval_s,
        flush_records=args.flush_records,
        rotate_after_s=args.rotate_after_s,
        retention_days=args.retention_days,
    ).validate()
    root = check_output_dir(args.dir, "--dir")  # before any Kafka work
    topics = archived_topics(settings.topic_prefix)
    ensure_topics(settings.kafka, catalogue(settings.topic_prefix, settings.stream.node_partitions))
    writer = ArchiveWriter(root, topics, archive)
    start = writer.recover()
    log.info("archive: %s, resuming %d partitions from the archive state", args.dir, len(start))
    source = KafkaArchiveSource(settings.kafka, args.group_id, sorted(topics), start)
    from confluent_kafka import Producer

    from peerwatch.exporters.consume import deadletter_topic
    from peerwatch.io.deadletter import KafkaDeadLetter
    from peerwatch.kafka_config import producer_config

    deadletter = KafkaDeadLetter(
        Producer(producer_config(settings.kafka)), deadletter_topic(settings.topic_prefix)
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    import dataclasses

    from peerwatch.exporters.telemetry_start import start_self_telemetry

    loop = ArchiveLoop(source, writer, topics, deadletter=deadletter)
    telemetry = start_self_telemetry(
        settings.telemetry, "archiver", lambda: dataclasses.asdict(loop.stats)
    )
    try:
        stats = loop.run(stop)
    finally:
        source.close()
        deadletter.flush()
        if telemetry is not None:
            telemetry.close()
    print(json.dumps({"records": stats.records, "undecodable": stats.undecodable,
                      "bad_time": stats.bad_time,
                      "commits": stats.commits, "dir": args.dir}))  # fmt: skip
    return 0
