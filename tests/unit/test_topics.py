from __future__ import annotations

import json
from pathlib import Path

import pytest

from peerwatch.errors import ConfigError
from peerwatch.settings import load_settings
from peerwatch.streams.live.app import internal_topics
from peerwatch.topics import (
    BY_NAME,
    FOLLOW_SAMPLES,
    HEALTH,
    JOB_WINDOWS,
    NODE_EVENTS,
    NODE_PARTITIONS,
    SAMPLES,
    TOPICS,
    catalogue,
    topic_for_schema,
)

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def test_every_topic_is_declared_once_with_a_known_schema() -> None:
    assert len(BY_NAME) == len(TOPICS)
    for spec in TOPICS:
        assert spec.partitions >= 1 and spec.retention_ms > 0
        assert spec.cleanup_policy in ("delete", "compact", "compact,delete")
        if spec.value_schema is not None:
            doc = json.loads((SCHEMAS / f"{spec.value_schema}.avsc").read_text())
            assert doc["name"] == spec.value_schema
            assert topic_for_schema(spec.value_schema) is spec


def test_node_keyed_inputs_are_copartitioned_with_the_hot_topic() -> None:
    assert SAMPLES.partitions >= 12
    for spec in TOPICS:
        if spec.key == "node" and spec.value_schema in ("NodeStateEvent", "HealthCheckResult"):
            assert spec.partitions == NODE_PARTITIONS == SAMPLES.partitions


def test_prefix_renames_every_topic_and_keeps_the_rest() -> None:
    prefixed = catalogue("t1.")
    assert [p.name for p in prefixed] == ["t1." + t.name for t in TOPICS]
    assert [p.partitions for p in prefixed] == [t.partitions for t in TOPICS]
    assert catalogue("") is TOPICS


def test_node_partitions_is_a_setting_of_every_copartitioned_topic() -> None:
    # The samples topic's partitions cap the hot path's workers: stream.node_partitions.
    grown = {t.name: t.partitions for t in catalogue("p.", node_partitions=48)}
    for spec in TOPICS:
        want = 48 if spec.name in FOLLOW_SAMPLES else spec.partitions
        assert grown["p." + spec.name] == want, spec.name
    assert {SAMPLES.name, NODE_EVENTS.name, HEALTH.name, JOB_WINDOWS.name} == FOLLOW_SAMPLES
    with pytest.raises(ValueError, match="node_partitions"):
        catalogue("p.", node_partitions=0)


def test_node_partitions_reaches_the_stream_apps_topics() -> None:
    settings = load_settings(env={"PEERWATCH_STREAM_NODE_PARTITIONS": "36"})
    assert settings.stream.node_partitions == 36
    by_name = {t.name: t for t in internal_topics(settings)}
    assert by_name["peerwatch-stream-findings"].partitions == 36  # re-keyed by node
    with pytest.raises(ConfigError, match=r"stream\.node_partitions"):
        load_settings(env={"PEERWATCH_STREAM_NODE_PARTITIONS": "0"})
