"""``peerwatch archive`` on a real broker: SIGKILLed mid-run while records keep arriving, then
restarted: every record is in the archive exactly once, and the archive stayed readable."""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path

from peerwatch.exporters.archive import STATE_FILE
from peerwatch.io.archive.reader import read_archive
from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.settings import KafkaSettings
from peerwatch.topic_admin import ensure_topics
from peerwatch.topics import JOB_EVENTS, SAMPLES, catalogue
from tests.integration.archive_helpers import (
    fleet_messages,
    peerwatch_env,
    produce,
    start,
    wait_for,
)


def committed(root: Path) -> dict[str, int]:
    """Records per topic the archive state says are durable (fresh topics start at offset 0)."""
    try:
        doc = json.loads((root / STATE_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return {t: sum(parts.values()) for t, parts in doc["offsets"].items()}


def test_killed_archiver_loses_nothing_and_duplicates_nothing(
    kafka_settings: KafkaSettings, topic_prefix: str, tmp_path: Path
) -> None:
    ensure_topics(kafka_settings, catalogue(topic_prefix))
    now_ms = int(time.time() * 1000)
    fleet = Fleet(parse_scenario({
        "fleet": {"nodes": 8, "gpus_per_node": 8, "interval_s": 1.0, "duration_s": 500,
                  "seed": 1, "start_ms": now_ms - now_ms % 1000 - 600_000},
        "jobs": [{"job_id": "501", "gpus": 64, "first_node": 0, "duration_s": 7200}],
    }))  # fmt: skip
    messages = fleet_messages(fleet, topic_prefix)
    per_topic = Counter(t for t, *_ in messages)
    samples_t, jobs_t = topic_prefix + SAMPLES.name, topic_prefix + JOB_EVENTS.name
    root, log = tmp_path / "archive", tmp_path / "archive.log"
    env = peerwatch_env(kafka_settings, topic_prefix)
    args = ["archive", "--dir", str(root), "--group-id", f"{topic_prefix}archive",
            "--flush-records", "250", "--flush-interval-s", "0.3"]  # fmt: skip

    # First half published before the archiver starts, the rest while it runs (and is killed).
    half = len(messages) // 2
    produce(kafka_settings, messages[:half])
    first = start(args, env, log)
    try:
        wait_for(lambda: committed(root).get(samples_t, 0) >= 500, 60, "a first commit")
        import threading

        rest = threading.Thread(target=produce, args=(kafka_settings, messages[half:], 1500.0))
        rest.start()
        time.sleep(0.7)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    killed_at = committed(root)
    assert 0 < killed_at[samples_t] < per_topic[samples_t], killed_at
    # What a killed archiver leaves is readable, without duplicates.
    partial = [(r["node"], r["seq"]) for r in read_archive(root, samples_t, "NodeGpuSample")]
    assert len(partial) == len(set(partial)) >= killed_at[samples_t]
    rest.join(60)

    second = start(args, env, log)
    try:
        wait_for(
            lambda: committed(root) == dict(per_topic), 90, "the restarted archiver to catch up"
        )
        second.send_signal(signal.SIGTERM)
        assert second.wait(30) == 0
    finally:
        if second.poll() is None:
            second.kill()
    assert not list(root.glob("*/*.tmp"))
    got = Counter((r["node"], r["seq"]) for r in read_archive(root, samples_t, "NodeGpuSample"))
    assert len(got) == per_topic[samples_t] == 8 * 500
    assert set(got.values()) == {1}, "a record is in the archive more than once"
    events = Counter(r["event_id"] for r in read_archive(root, jobs_t, "JobEvent"))
    assert sum(events.values()) == per_topic[jobs_t] and set(events.values()) == {1}
    assert "resuming" in log.read_text()
