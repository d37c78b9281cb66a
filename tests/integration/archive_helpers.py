"""Shared by the archive/replay integration tests: run ``peerwatch`` subcommands as processes,
publish simulated records, read a topic back."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from peerwatch.kafka_config import producer_config
from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.publish import STREAM_TOPICS
from peerwatch.schemas.codec import AvroCodec
from peerwatch.settings import KafkaSettings


def peerwatch_env(kafka: KafkaSettings, prefix: str) -> dict[str, str]:
    return {**os.environ, "PEERWATCH_KAFKA_BOOTSTRAP": kafka.bootstrap_servers,
            "PEERWATCH_TOPIC_PREFIX": prefix}  # fmt: skip


def start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """``peerwatch ARGS`` in its own process group, output to ``log``."""
    with log.open("ab") as fh:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "peerwatch.cli", *args], env=env, stdout=fh, stderr=fh,
            start_new_session=True,
        )  # fmt: skip


def run(args: list[str], env: dict[str, str], timeout_s: float = 300) -> str:
    """``peerwatch ARGS`` to completion; returns stdout. Raises CalledProcessError."""
    done = subprocess.run(
        [sys.executable, "-m", "peerwatch.cli", *args], env=env, capture_output=True,
        timeout=timeout_s, check=False,
    )  # fmt: skip
    if done.returncode:
        raise AssertionError(f"peerwatch {args} failed: {done.stderr.decode()[-3000:]}")
    return done.stdout.decode()


def wait_for(cond: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def fleet_messages(fleet: Fleet, prefix: str) -> list[tuple[str, bytes, bytes, int]]:
    """(topic, key, value, timestamp ms) of every record of ``fleet`` except step times."""
    codecs = {s: AvroCodec(t.value_schema or "") for s, t in STREAM_TOPICS.items()}
    out = []
    for tick_ms, records in fleet.timed_ticks():
        for r in records:
            if r.stream == "step-times":
                continue
            out.append((prefix + STREAM_TOPICS[r.stream].name, r.key.encode(),
                        codecs[r.stream].encode(r.value), int(r.value.get("ts_ms", tick_ms))))  # fmt: skip
    return out


def produce(kafka: KafkaSettings, messages: Iterable[tuple[str, bytes, bytes, int]],
            rate_per_s: float = 0.0) -> int:  # fmt: skip
    """Publish and wait for every delivery; ``rate_per_s`` paces (0 = as fast as possible)."""
    errors: list[Any] = []
    producer = Producer(producer_config(kafka))
    t0, n = time.monotonic(), 0
    for topic, key, value, ts_ms in messages:
        while True:
            try:
                producer.produce(topic, value, key, timestamp=ts_ms,
                                 on_delivery=lambda err, _m: errors.append(err) if err else None)  # fmt: skip
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
        n += 1
        if rate_per_s > 0:
            ahead = n / rate_per_s - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
    assert producer.flush(60) == 0 and not errors, errors[:3]
    return n


def read_values(kafka: KafkaSettings, topic: str, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """Every decoded record of ``topic`` up to its end offsets as of the call."""
    from peerwatch.schemas.codec import decode_any
    from peerwatch.streams.tools.bench_run import read_topic

    return [decode_any(r.value)[1] for r in read_topic(kafka, topic, timeout_s)]
