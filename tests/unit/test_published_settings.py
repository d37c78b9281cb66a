"""The stream worker's published settings, and replay's choice of them (no Kafka: fakes)."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pytest

from peerwatch.commands import replay as replay_cmd
from peerwatch.settings import Settings, with_overrides
from peerwatch.streams.live import published_settings as published
from peerwatch.streams.offline.replay import TimeRange
from peerwatch.topics import STREAM_SETTINGS


class FakeProducer:
    def __init__(self, conf: dict[str, Any]) -> None:
        self.conf = conf
        self.sent: list[tuple[str, bytes, bytes]] = []

    def produce(self, topic: str, key: bytes, value: bytes) -> None:
        self.sent.append((topic, key, value))

    def flush(self, timeout: float) -> int:
        return 0


def tree(**overrides: Any) -> Settings:
    return with_overrides(Settings(), overrides)


def test_published_record_carries_every_detector_and_policy_number() -> None:
    live = tree(**{"detector.z_threshold": 4.0, "policy.drain_after_confirmed_s": 300,
                   "stream.lateness_s": 7.0, "topic_prefix": "t."})  # fmt: skip
    made: list[FakeProducer] = []

    def factory(conf: dict[str, Any]) -> FakeProducer:
        made.append(FakeProducer(conf))
        return made[-1]

    published.publish_settings(live, 1_000, producer_factory=factory)
    [(topic, key, value)] = made[0].sent
    assert topic == "t." + STREAM_SETTINGS.name and key == b"peerwatch-stream|1000"
    record = json.loads(value)
    back = published.with_published(Settings(), record)
    assert (back.detector, back.policy, back.stream) == (live.detector, live.policy, live.stream)


def test_the_record_live_at_the_start_of_the_range_is_chosen() -> None:
    old = json.loads(published.settings_record(tree(**{"detector.z_threshold": 4.0}), 1_000)[1])
    new = json.loads(published.settings_record(tree(**{"detector.z_threshold": 5.0}), 5_000)[1])
    other = {**new, "app_id": "other", "effective_from_ms": 2_000}
    records = [new, old, other]
    assert published.settings_at(records, "peerwatch-stream", 999) is None
    assert published.settings_at(records, "peerwatch-stream", 4_999) == old
    assert published.settings_at(records, "peerwatch-stream", 5_000) == new
    assert old["digest"] != new["digest"]


def args(**kw: Any) -> argparse.Namespace:
    base = {"config": None, "drain_config": None, "kafka": True, "archive": None,
            "settings_from": None, "window_s": None, "lateness_s": None, "job_grace_s": None}  # fmt: skip
    return argparse.Namespace(**{**base, **kw})


def test_replay_uses_the_live_settings_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in ("PEERWATCH_CONFIG", "PEERWATCH_DETECTOR_Z_THRESHOLD"):
        monkeypatch.delenv(var, raising=False)
    record = json.loads(published.settings_record(tree(**{"detector.z_threshold": 4.5}), 1_000)[1])
    monkeypatch.setattr(published, "read_published", lambda kafka, topic: [record])
    span = TimeRange(2_000, 3_000)
    extra: dict[str, Any] = {}
    live = replay_cmd._replay_settings(args(), span, extra)
    assert live.detector.z_threshold == 4.5 and extra["settings_from"].startswith("live ")
    config = replay_cmd._replay_settings(args(settings_from="config"), span, extra)
    assert config.detector.z_threshold == Settings().detector.z_threshold
    assert extra["settings_from"] == "config"
    # An archive replay uses the config unless asked; a range before any record too.
    assert replay_cmd._replay_settings(args(kafka=False), span, {}) == Settings()
    early = replay_cmd._replay_settings(args(), TimeRange(0, 500), extra)
    assert early == Settings() and extra["settings_from"] == "config"


def test_values_that_are_no_settings_record_are_skipped() -> None:
    # Found by the input fuzzer: a value nested ~100,000 deep raised RecursionError out of
    # read_published (only ValueError was caught) and stopped the replay.
    from peerwatch.streams.live.published_settings import published_records, settings_record

    _, good = settings_record(Settings(), 1_000)
    bad = [b"[" * 100_000, b"[1]", b"\xff", None, b"", b"1e999"]
    assert published_records([*bad, good]) == [json.loads(good)]
