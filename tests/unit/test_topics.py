from __future__ import annotations

import json
from pathlib import Path

from peerwatch.topics import BY_NAME, NODE_PARTITIONS, SAMPLES, TOPICS, catalogue, topic_for_schema

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
