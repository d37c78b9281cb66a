"""The role ACLs: narrowest grants per role, the documented table equal to the code's."""

from __future__ import annotations

from pathlib import Path

import pytest

from peerwatch.acls import ROLES, Grant, acl_table, bindings, default_users, grants
from peerwatch.topics import ACTIONS, RECOMMENDATIONS, SAMPLES, TOPICS


def _writers(topic: str, **kw: str) -> set[str]:
    return {r for r in ROLES for g in grants(r, **kw)
            if g.resource == "topic" and g.name == topic and g.operation == "Write"}  # fmt: skip


def test_only_the_stream_writes_recommendations_and_only_the_controller_actions() -> None:
    assert _writers(RECOMMENDATIONS.name) == {"stream"}
    assert _writers(ACTIONS.name) == {"drain"}
    assert _writers(SAMPLES.name) == {"agent"}


def test_the_agent_writes_samples_and_dead_letters_and_nothing_else() -> None:
    assert grants("agent") == [
        Grant("topic", "peerwatch.deadletter", "literal", "Write"),
        Grant("topic", "peerwatch.gpu.samples", "literal", "Write"),
        Grant("topic", "peerwatch.nic.samples", "literal", "Write"),
    ]


def test_no_role_gets_cluster_rights_alter_or_a_wildcard() -> None:
    for role in ROLES:
        for g in grants(role):
            assert g.resource in ("topic", "group") and g.name not in ("*", "")
            assert g.operation in ("Read", "Write", "Create", "Describe", "DescribeConfigs")
            if g.pattern == "prefixed":  # only a role's own names
                assert g.name in ("peerwatch-stream", "peerwatch-export", "peerwatch-archive")


def test_readers_write_only_dead_letters() -> None:
    for role in ("exporter", "archiver"):
        writes = {g.name for g in grants(role) if g.operation == "Write"}
        assert writes == {"peerwatch.deadletter"}


def test_prefix_app_id_and_group_follow_the_settings() -> None:
    got = grants("stream", topic_prefix="t1.", app_id="t1.app")
    assert Grant("topic", "t1.app", "prefixed", "Create") in got
    assert Grant("group", "t1.app", "prefixed", "Read") in got
    assert all(g.name.startswith("t1.") for g in got)
    assert Grant("group", "g7", "literal", "Read") in grants("drain", drain_group="g7")
    pairs = bindings({"agent": "svc-a"}, topic_prefix="t1.")
    assert {p for p, _ in pairs} == {"User:svc-a"}
    with pytest.raises(KeyError):
        grants("root")


def test_every_catalogue_topic_has_a_writer_but_step_times() -> None:
    unwritten = {t.name for t in TOPICS if not _writers(t.name)}
    assert unwritten == {"peerwatch.training.step-times"}  # training code's own principal


def test_operations_doc_holds_the_generated_table() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "operations.md").read_text()
    assert acl_table() in doc
    assert all(f"User:{u}" in doc for u in default_users().values())
