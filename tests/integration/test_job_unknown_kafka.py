"""``peerwatch job`` for a job the cluster has no record of, on the real broker (issue 40 item
10): it says the job is unknown and how long Kafka keeps windows and job events, and exits 1
(before: "0 GPUs on 0 nodes", exit 0)."""

from __future__ import annotations

import time

import pytest

from peerwatch.cli import main
from peerwatch.settings import KafkaSettings
from peerwatch.topic_admin import ensure_topics
from peerwatch.topics import catalogue


def test_an_unknown_job_is_said_to_be_unknown_with_the_retention(
    kafka_settings: KafkaSettings,
    topic_prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ensure_topics(kafka_settings, catalogue(topic_prefix))
    monkeypatch.setenv("PEERWATCH_KAFKA_BOOTSTRAP", kafka_settings.bootstrap_servers)
    monkeypatch.setenv("PEERWATCH_TOPIC_PREFIX", topic_prefix)
    deadline = time.monotonic() + 60
    while True:  # topics just created: their leaders may not be elected yet (retriable)
        code = main(["job", "999999"])
        out = capsys.readouterr()
        if code != 2 or "Not leader" not in out.err or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert code == 1, out.err
    assert "job 999999 is unknown: Kafka holds no event, window or finding of it" in out.err
    assert "GPU windows 3 days and job events 14 days" in out.err
    assert "0 GPUs" not in out.out
