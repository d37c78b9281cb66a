"""`peerwatch topics create` against the real broker: idempotent, and refuses mismatched topics."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from peerwatch.cli import main
from peerwatch.kafka_config import admin_config
from peerwatch.settings import KafkaSettings
from peerwatch.topics import catalogue


def test_create_twice_changes_nothing(
    kafka_settings: KafkaSettings, topic_prefix: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    monkeypatch.setenv("PEERWATCH_KAFKA_BOOTSTRAP", kafka_settings.bootstrap_servers)
    monkeypatch.setenv("PEERWATCH_TOPIC_PREFIX", topic_prefix)
    assert main(["topics", "create"]) == 0
    first = capsys.readouterr().out
    assert first.count("created") == len(catalogue())
    assert main(["topics", "create"]) == 0
    second = capsys.readouterr().out
    assert second.count("exists") == len(catalogue()) and "created" not in second
    md = AdminClient(admin_config(kafka_settings)).list_topics(timeout=10)
    for spec in catalogue(topic_prefix):
        assert len(md.topics[spec.name].partitions) == spec.partitions


def test_mismatched_partition_count_is_refused_by_name(
    kafka_settings: KafkaSettings, topic_prefix: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    wrong = catalogue(topic_prefix)[0]
    admin = AdminClient(admin_config(kafka_settings))
    admin.create_topics([NewTopic(wrong.name, wrong.partitions + 1, 1)])[wrong.name].result(30)
    monkeypatch.setenv("PEERWATCH_KAFKA_BOOTSTRAP", kafka_settings.bootstrap_servers)
    monkeypatch.setenv("PEERWATCH_TOPIC_PREFIX", topic_prefix)
    assert main(["topics", "create"]) == 2
    err = capsys.readouterr().err
    assert wrong.name in err and f"has {wrong.partitions + 1} partitions" in err
    md = admin.list_topics(timeout=10)
    assert not any(t.name in md.topics for t in catalogue(topic_prefix)[1:]), "nothing created"
