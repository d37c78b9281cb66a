"""Confluent wire format against confluent-kafka's in-memory Schema Registry (mock://)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient, SchemaRegistryError
from fastavro import schemaless_writer
from test_codec import realistic

from peerwatch.errors import CorruptRecordError, EncodeError, ServiceError, UnknownSchemaError
from peerwatch.schemas import registry
from peerwatch.schemas.confluent import ConfluentCodec

REALISTIC = realistic()  # the WindowBatch's bytes are hex in the JSON file


@pytest.fixture
def client() -> Any:
    return SchemaRegistryClient.new_client({"url": "mock://peerwatch-test"})


def _message(schema_id: int, schema: Any, record: dict[str, Any]) -> bytes:
    buf = io.BytesIO()
    buf.write(b"\x00" + schema_id.to_bytes(4, "big"))
    schemaless_writer(buf, schema, record)
    return buf.getvalue()


@pytest.mark.parametrize("name", registry.SCHEMA_NAMES)
def test_round_trip_and_wire_header(client: Any, name: str) -> None:
    codec = ConfluentCodec(name, client)
    data = codec.encode(REALISTIC[name])
    assert data[0] == 0
    schema_id = int.from_bytes(data[1:5], "big")
    assert schema_id == codec.schema_id
    assert codec.decode(data) == REALISTIC[name]
    stored = client.get_schema(schema_id)
    assert stored.schema_type == "AVRO"
    assert json.loads(stored.schema_str) == registry.raw_schema(name)


def test_registers_under_record_name_once(client: Any) -> None:
    codec = ConfluentCodec("StepTime", client)
    first = codec.encode(REALISTIC["StepTime"])
    second = codec.encode(REALISTIC["StepTime"])
    assert first == second
    assert client.get_subjects() == ["io.peerwatch.StepTime"]
    assert client.get_versions("io.peerwatch.StepTime") == [1]


def test_topic_subject_and_second_codec_share_id(client: Any) -> None:
    writer = ConfluentCodec("JobEvent", client, subject="peerwatch.jobs-value")
    reader = ConfluentCodec("JobEvent", client, subject="peerwatch.jobs-value")
    data = writer.encode(REALISTIC["JobEvent"])
    assert reader.decode(data) == REALISTIC["JobEvent"]
    assert client.get_subjects() == ["peerwatch.jobs-value"]


class _CountingClient:
    """Wraps the mock client and counts calls: the codec must be lazy and cache lookups."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[str] = []

    def register_schema(self, subject_name: str, schema: Schema) -> int:
        self.calls.append("register")
        return int(self.inner.register_schema(subject_name, schema))

    def get_schema(self, schema_id: int) -> Schema:
        self.calls.append("get")
        found: Schema = self.inner.get_schema(schema_id)
        return found


def test_lazy_and_cached(client: Any) -> None:
    counting = _CountingClient(client)
    codec = ConfluentCodec("StepTime", counting)
    assert counting.calls == []
    old_raw = registry.raw_schema("StepTime")
    old_raw["fields"] = [f for f in old_raw["fields"] if f["name"] != "gpu_index"]
    old_id = client.register_schema("io.peerwatch.StepTime", Schema(json.dumps(old_raw), "AVRO"))
    old_record = {k: v for k, v in REALISTIC["StepTime"].items() if k != "gpu_index"}
    message = _message(old_id, registry.parse_wire_schema(old_raw), old_record)
    for _ in range(3):
        assert codec.decode(message) == {**old_record, "gpu_index": None}
    assert counting.calls == ["get"]
    codec.encode(REALISTIC["StepTime"])
    codec.encode(REALISTIC["StepTime"])
    assert counting.calls == ["get", "register"]


def test_unknown_id(client: Any) -> None:
    codec = ConfluentCodec("StepTime", client)
    with pytest.raises(UnknownSchemaError, match="schema id 4242"):
        codec.decode(b"\x00\x00\x00\x10\x92" + b"\x00" * 20)


def test_id_of_another_record_type(client: Any) -> None:
    job = ConfluentCodec("JobEvent", client).encode(REALISTIC["JobEvent"])
    with pytest.raises(UnknownSchemaError, match="cannot be read as StepTime"):
        ConfluentCodec("StepTime", client).decode(job)


def test_non_avro_schema_id(client: Any) -> None:
    schema_id = client.register_schema("other", Schema('{"type": "object"}', "JSON"))
    with pytest.raises(UnknownSchemaError, match="JSON"):
        ConfluentCodec("StepTime", client).decode(b"\x00" + schema_id.to_bytes(4, "big") + b"\x00")


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "truncated"),
        (b"\x00\x00\x00", "truncated"),
        (b"\xc3\x01" + b"\x00" * 20, "bad magic c3"),
    ],
)
def test_corrupt_headers(client: Any, data: bytes, match: str) -> None:
    with pytest.raises(CorruptRecordError, match=match):
        ConfluentCodec("StepTime", client).decode(data)


def test_corrupt_bodies(client: Any) -> None:
    codec = ConfluentCodec("NodeGpuSample", client)
    data = codec.encode(REALISTIC["NodeGpuSample"])
    for cut in range(5, len(data), 7):
        with pytest.raises(CorruptRecordError):
            codec.decode(data[:cut])
    with pytest.raises(CorruptRecordError, match="trailing"):
        codec.decode(data + b"\x00")


def test_encode_error(client: Any) -> None:
    record = {**REALISTIC["StepTime"], "step": "one"}
    with pytest.raises(EncodeError, match="step"):
        ConfluentCodec("StepTime", client).encode(record)


class _BrokenRegistry:
    def register_schema(self, subject_name: str, schema: Schema) -> int:
        raise SchemaRegistryError(503, 50301, "unavailable")

    def get_schema(self, schema_id: int) -> Schema:
        raise SchemaRegistryError(500, 50001, "boom")


def test_registry_failures_are_service_errors() -> None:
    codec = ConfluentCodec("StepTime", _BrokenRegistry())
    with pytest.raises(ServiceError, match=r"cannot register io\.peerwatch\.StepTime"):
        codec.encode(REALISTIC["StepTime"])
    with pytest.raises(ServiceError, match="looking up id 7"):
        codec.decode(b"\x00\x00\x00\x00\x07\x00")
