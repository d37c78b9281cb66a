"""`peerwatch topics create` against the real broker: idempotent, and refuses mismatched topics."""

from __future__ import annotations

from typing import Any

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


def test_a_topic_the_first_read_missed_is_described_and_refused(
    kafka_settings: KafkaSettings, topic_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 12 item 9: when the first read misses a topic that exists (slow propagation on a
    # busy broker), the create answers TOPIC_ALREADY_EXISTS; that was recorded as "exists" with
    # the catalogue's partition count. Here the first read is made to miss it.
    from peerwatch import topic_admin
    from peerwatch.errors import TopicError

    specs = catalogue(topic_prefix)[:3]
    wrong = specs[1]
    admin = AdminClient(admin_config(kafka_settings))
    admin.create_topics([NewTopic(wrong.name, wrong.partitions + 2, 1)])[wrong.name].result(30)
    real = topic_admin.describe_partitions
    calls: list[list[str]] = []

    def first_read_misses(admin: Any, names: list[str], timeout_s: float) -> dict[str, int]:
        calls.append(names)
        return {} if len(calls) == 1 else real(admin, names, timeout_s)

    monkeypatch.setattr(topic_admin, "describe_partitions", first_read_misses)
    with pytest.raises(TopicError, match=rf"{wrong.name} has {wrong.partitions + 2} partitions"):
        topic_admin.ensure_topics(kafka_settings, specs)
    assert len(calls) >= 2


def test_config_differences_are_reported(
    kafka_settings: KafkaSettings, topic_prefix: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    odd = catalogue(topic_prefix)[0]
    admin = AdminClient(admin_config(kafka_settings))
    config = {**odd.config(), "retention.ms": "1000"}
    admin.create_topics([NewTopic(odd.name, odd.partitions, 1, config=config)])[odd.name].result(30)
    monkeypatch.setenv("PEERWATCH_KAFKA_BOOTSTRAP", kafka_settings.bootstrap_servers)
    monkeypatch.setenv("PEERWATCH_TOPIC_PREFIX", topic_prefix)
    assert main(["topics", "create"]) == 0
    lines = {line.split()[1]: line for line in capsys.readouterr().out.splitlines()}
    assert lines[odd.name].startswith("exists") and (
        f"config differs: retention.ms is 1000, the catalogue says {odd.retention_ms}"
        in lines[odd.name]
    )
    others = [s.name for s in catalogue(topic_prefix)[1:]]
    assert all("created" in lines[n] and "differs" not in lines[n] for n in others)


def test_list_shows_what_the_broker_holds_beside_the_catalogue(
    kafka_settings: KafkaSettings, topic_prefix: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    specs = catalogue(topic_prefix)
    right, wrong = specs[0], specs[1]
    admin = AdminClient(admin_config(kafka_settings))
    created = admin.create_topics([NewTopic(right.name, right.partitions, 1, config=right.config()),
                                   NewTopic(wrong.name, wrong.partitions + 1, 1)])  # fmt: skip
    for future in created.values():
        future.result(30)
    from peerwatch.topic_admin import _described

    _described(admin, [right, wrong], 30)  # a new topic can take a moment to be described
    monkeypatch.setenv("PEERWATCH_KAFKA_BOOTSTRAP", kafka_settings.bootstrap_servers)
    monkeypatch.setenv("PEERWATCH_TOPIC_PREFIX", topic_prefix)
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["topics", "list"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows[right.name].rstrip().endswith(f"{right.partitions} partitions")
    assert (
        f"{wrong.partitions + 1} partitions (the catalogue says {wrong.partitions})"
        in (rows[wrong.name])
    )
    assert all(rows[s.name].rstrip().endswith("missing") for s in specs[2:])


def test_list_without_a_broker_still_prints_the_catalogue(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("PEERWATCH_KAFKA_BOOTSTRAP", f"127.0.0.1:{port}")
    monkeypatch.setenv("COLUMNS", "250")
    assert main(["topics", "list"]) == 0
    out, err = capsys.readouterr()
    assert "the broker was not asked" in err
    assert all(spec.name in out for spec in catalogue()) and "broker" not in out.splitlines()[0]
