"""The recovery watchdog on a real worker and the real broker: a worker whose faust table
recovery can never complete logs the error and exits with status 3 (for its service manager to
restart it), instead of looking alive and doing nothing.

The recovery is made to hang the way a changelog faust cannot read does: each partition of the
jobs table's changelog ends in an aborted transaction. faust reads a changelog up to its high
watermark, but the transaction's control record at the end is never handed to a consumer, so
the recovery waits for it for ever (6 records left).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from confluent_kafka import Producer

from peerwatch.kafka_config import producer_config
from peerwatch.settings import KafkaSettings
from peerwatch.topic_admin import ensure_topics
from peerwatch.topics import JOB_EVENTS, TopicSpec


def test_a_worker_whose_recovery_cannot_complete_exits_with_status_3(
    kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path
) -> None:
    changelog = f"{topic_prefix}peerwatch-stream-jobs-changelog"
    ensure_topics(kafka_settings, [TopicSpec(changelog, "job", None, JOB_EVENTS.partitions,
                                             "compact", 86_400_000, "the jobs table")])  # fmt: skip
    producer = Producer(producer_config(kafka_settings, **{"transactional.id": topic_prefix}))
    producer.init_transactions(30)
    for partition in range(JOB_EVENTS.partitions):
        producer.begin_transaction()
        producer.produce(changelog, b"{}", b"job-1", partition=partition)
        producer.flush(30)
        producer.abort_transaction(30)
    env = {
        **os.environ,
        "PEERWATCH_KAFKA_BOOTSTRAP": kafka_settings.bootstrap_servers,
        "PEERWATCH_TOPIC_PREFIX": topic_prefix,
        "PEERWATCH_STATE_DIR": str(tmp_path / "state"),
        "PEERWATCH_STREAM_RECOVERY_TIMEOUT_S": "5",
        "PEERWATCH_STREAM_HOT_PROCESS": "false",
    }
    done = subprocess.run(
        [sys.executable, "-m", "peerwatch.cli", "stream", "--loglevel", "info"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 3, output[-3000:]
    assert re.search(r"faust's table recovery made no progress for \d+ s", output), output[-3000:]
    assert f"({JOB_EVENTS.partitions} changelog records left to read)" in output
