"""The local Kafka's KRaft cluster id: the storage tool must never see it as an option."""

from __future__ import annotations

import base64
import uuid

import pytest

from peerwatch.local import kafka


def test_cluster_ids_are_22_url_safe_characters_never_starting_with_a_dash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The first two draws encode to ids starting with "-" (first byte 0xF8..0xFB); the third not.
    draws = iter([b"\xf8" + b"\x00" * 15, b"\xfb" + b"\x11" * 15, b"\x01" * 16])
    monkeypatch.setattr(kafka.uuid, "uuid4", lambda: uuid.UUID(bytes=next(draws)))
    cid = kafka._cluster_id()
    assert cid == base64.urlsafe_b64encode(b"\x01" * 16).decode().rstrip("=")
    monkeypatch.undo()
    for _ in range(2000):
        cid = kafka._cluster_id()
        assert len(cid) == 22 and not cid.startswith("-")
        assert set(cid) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
