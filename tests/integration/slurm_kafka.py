"""Helpers for the Slurm + Kafka integration tests: read back and decode what was published."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from peerwatch.kafka_config import consumer_config
from peerwatch.schemas.codec import AvroCodec
from peerwatch.settings import KafkaSettings

REPO_ROOT = Path(__file__).resolve().parents[2]
#: The interpreter of this test run: its venv has peerwatch installed.
PYTHON = sys.executable


class TopicReader:
    """Reads one topic from the beginning, decoding every record with its schema's codec."""

    def __init__(self, settings: KafkaSettings, topic: str, schema: str) -> None:
        self._consumer = Consumer(consumer_config(settings, f"read-{uuid.uuid4().hex}"))
        self._topic = topic
        self._codec = AvroCodec(schema)
        self.records: list[dict[str, Any]] = []
        self._assigned = False

    def _assign(self) -> None:
        md = self._consumer.list_topics(self._topic, timeout=10)
        partitions = md.topics[self._topic].partitions
        self._consumer.assign([TopicPartition(self._topic, p, 0) for p in partitions])
        self._assigned = True

    def read_until(
        self, done: Callable[[list[dict[str, Any]]], bool], timeout_s: float = 20.0
    ) -> list[dict[str, Any]]:
        """Poll until ``done(records)`` or the timeout; returns all records read so far."""
        if not self._assigned:
            self._assign()
        deadline = time.monotonic() + timeout_s
        while not done(self.records) and time.monotonic() < deadline:
            for msg in self._consumer.consume(500, timeout=0.3):
                if msg.error() is None:
                    self.records.append(self._codec.decode(msg.value() or b""))
        return self.records

    def settle(self, quiet_s: float = 2.0) -> list[dict[str, Any]]:
        """Read until nothing new arrived for ``quiet_s`` seconds."""
        if not self._assigned:
            self._assign()
        last, deadline = len(self.records), time.monotonic() + quiet_s
        while time.monotonic() < deadline:
            for msg in self._consumer.consume(500, timeout=0.3):
                if msg.error() is None:
                    self.records.append(self._codec.decode(msg.value() or b""))
            if len(self.records) != last:
                last, deadline = len(self.records), time.monotonic() + quiet_s
        return self.records

    def close(self) -> None:
        self._consumer.close()


def peerwatch_env(settings: KafkaSettings, prefix: str, state_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PEERWATCH_KAFKA_BOOTSTRAP=settings.bootstrap_servers,
        PEERWATCH_TOPIC_PREFIX=prefix,
        PEERWATCH_STATE_DIR=str(state_dir),
        PEERWATCH_SPOOL_DIR=str(state_dir / "spool"),
    )
    return env


def run_peerwatch(
    args: Sequence[str], env: dict[str, str], timeout_s: float = 60.0
) -> subprocess.CompletedProcess[str]:
    """``python -m peerwatch.cli ARGS`` (the console script's code path)."""
    return subprocess.run(
        [PYTHON, "-m", "peerwatch.cli", *args], env=env, capture_output=True, text=True,
        timeout=timeout_s, cwd=REPO_ROOT, check=False,
    )  # fmt: skip
