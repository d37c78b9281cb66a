"""The local Kafka's KRaft cluster id: the storage tool must never see it as an option."""

from __future__ import annotations

import base64
import uuid
from typing import Any

import pytest

from peerwatch.errors import ServiceError
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


def test_the_controller_listens_beside_the_broker_clear_of_alertmanager(tmp_path: Any) -> None:
    broker = kafka.LocalKafka(cache_dir=tmp_path, state_dir=tmp_path)
    assert broker.controller == 9192 != 9093  # 9093: `peerwatch alertmanager start`
    assert kafka.LocalKafka(cache_dir=tmp_path, state_dir=tmp_path, port=19092).controller == 19192
    explicit = kafka.LocalKafka(cache_dir=tmp_path, state_dir=tmp_path, controller_port=29093)
    assert explicit.controller == 29093


def test_start_names_a_controller_port_in_use(tmp_path: Any, monkeypatch: Any) -> None:
    broker = kafka.LocalKafka(cache_dir=tmp_path, state_dir=tmp_path)
    monkeypatch.setattr(kafka, "port_in_use", lambda port, host="127.0.0.1": port == 9192)
    with pytest.raises(
        ServiceError, match=r"127.0.0.1:9192 \(the KRaft controller\).*--controller-port"
    ):
        broker.start(timeout_s=1.0)
