"""Confluent wire format, used instead of single-object encoding when a Schema Registry is set.

A message is ``00`` + the 4-byte big-endian registry schema id + the Avro binary body. The
current schema is registered on first encode (never in the constructor); on decode the id is
looked up once, checked with ``compat`` against the current schema, and cached.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol

from confluent_kafka.schema_registry import Schema, SchemaRegistryError

from peerwatch.errors import CorruptRecordError, ServiceError, UnknownSchemaError
from peerwatch.schemas import registry
from peerwatch.schemas.codec import Bytes, read_body, write_message
from peerwatch.schemas.compat import check_compatible

MAGIC = b"\x00"
HEADER_LEN = 5
_NOT_FOUND = 404


class SchemaRegistry(Protocol):
    """The part of confluent-kafka's ``SchemaRegistryClient`` this codec uses."""

    def register_schema(self, subject_name: str, schema: Schema) -> int: ...

    def get_schema(self, schema_id: int) -> Schema: ...


class ConfluentCodec:
    """Encode and decode one schema (by name) in the Confluent wire format."""

    def __init__(
        self, schema_name: str, registry_client: SchemaRegistry, *, subject: str | None = None
    ) -> None:
        """No registry call here. ``subject`` defaults to the record's full name
        (RecordNameStrategy, e.g. ``io.peerwatch.NodeGpuSample``); pass ``<topic>-value``
        for TopicNameStrategy. Raises UnknownSchemaError for an unknown schema name.
        """
        raw = registry.raw_schema(schema_name)
        self.schema_name = schema_name
        self.subject = subject or f"{raw.get('namespace', '')}.{raw['name']}".lstrip(".")
        self._client = registry_client
        self._schema = registry.current_schema(schema_name)
        self._fingerprint = registry.fingerprint(self._schema)
        # The registry gets the schema as shipped (with logical types) for other consumers.
        self._schema_str = json.dumps(raw, separators=(",", ":"))
        self._header: bytes | None = None
        # schema id -> (writer schema, reader schema or None when no resolution is needed)
        self._readers: dict[int, tuple[Any, Any]] = {}

    @property
    def schema_id(self) -> int:
        """The registry id of the current schema; registers it on first use.

        Raises ServiceError when the registry refuses or cannot be reached.
        """
        return int.from_bytes(self._ensure_header()[1:], "big")

    def _ensure_header(self) -> bytes:
        if self._header is None:
            try:
                schema_id = self._client.register_schema(
                    self.subject, Schema(self._schema_str, "AVRO")
                )
            except Exception as exc:  # the client raises its own and httpx errors
                raise ServiceError(
                    f"schema registry: cannot register {self.subject}: {exc}"
                ) from exc
            self._readers.setdefault(schema_id, (self._schema, None))
            self._header = MAGIC + schema_id.to_bytes(4, "big")
        return self._header

    def encode(self, record: Mapping[str, Any]) -> bytes:
        """Encode ``record`` with the current schema (times as int ms).

        Raises EncodeError when a value does not fit, ServiceError when registration fails.
        """
        return write_message(self._ensure_header(), self._schema, record, self.schema_name)

    def decode(self, data: Bytes) -> dict[str, Any]:
        """Decode a message written with any registered schema the current one can read.

        Raises CorruptRecordError (bad magic, truncated, undecodable), UnknownSchemaError (id
        not in the registry, not Avro, or not readable as this schema) and ServiceError (the
        registry could not be asked).
        """
        if len(data) < HEADER_LEN:
            raise CorruptRecordError(
                f"truncated message: {len(data)} bytes, the Confluent header alone is {HEADER_LEN}"
            )
        if data[:1] != MAGIC:
            raise CorruptRecordError(
                f"bad magic {bytes(data[:1]).hex()}, expected {MAGIC.hex()} (Confluent wire format)"
            )
        schema_id = int.from_bytes(data[1:HEADER_LEN], "big")
        entry = self._readers.get(schema_id)
        if entry is None:
            entry = self._lookup(schema_id)
            self._readers[schema_id] = entry
        writer, reader = entry
        return read_body(data, HEADER_LEN, writer, reader, f"{self.schema_name} (id {schema_id})")

    def _lookup(self, schema_id: int) -> tuple[Any, Any]:
        try:
            found = self._client.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.http_status_code == _NOT_FOUND:
                raise UnknownSchemaError(f"schema id {schema_id} is not in the registry") from exc
            raise ServiceError(f"schema registry: looking up id {schema_id}: {exc}") from exc
        except Exception as exc:  # transport errors
            raise ServiceError(f"schema registry: looking up id {schema_id}: {exc}") from exc
        if (found.schema_type or "AVRO") != "AVRO" or found.schema_str is None:
            raise UnknownSchemaError(f"schema id {schema_id} is a {found.schema_type} schema")
        try:
            writer = registry.parse_wire_schema(json.loads(found.schema_str))
        except Exception as exc:  # JSON or Avro parse errors
            raise UnknownSchemaError(f"schema id {schema_id} is not valid Avro: {exc}") from exc
        if registry.fingerprint(writer) == self._fingerprint:
            return self._schema, None
        problems = check_compatible(self._schema, writer)
        if problems:
            raise UnknownSchemaError(
                f"schema id {schema_id} cannot be read as {self.schema_name}: {'; '.join(problems)}"
            )
        return writer, self._schema
