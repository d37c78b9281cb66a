"""Avro single-object encoding of peerwatch records (the default wire format).

A message is ``C3 01`` + the 8-byte little-endian CRC-64-AVRO fingerprint of the writer
schema + the Avro binary body. Records are written with the current schema; on read, the
fingerprint selects the writer schema among the current and every released version, and the
body is resolved into the current schema. Times stay int milliseconds (see registry).

Every failure on bad input is a ``peerwatch.errors.CodecError`` subclass; nothing else escapes
``decode``, whatever the bytes.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from io import BytesIO
from typing import Any

from fastavro import schemaless_reader, schemaless_writer
from fastavro.validation import ValidationError, validate

from peerwatch.errors import CorruptRecordError, EncodeError, UnknownSchemaError
from peerwatch.schemas import registry
from peerwatch.schemas.compiled import Unsupported, compile_decoder, compile_encoder
from peerwatch.schemas.native import native_decoder

MAGIC = b"\xc3\x01"
HEADER_LEN = len(MAGIC) + 8

Bytes = bytes | bytearray | memoryview


def split_header(data: Bytes) -> bytes:
    """The writer fingerprint (8 bytes) of a single-object message.

    Raises CorruptRecordError when ``data`` is shorter than the header or the magic is wrong.
    """
    if len(data) < HEADER_LEN:
        raise CorruptRecordError(
            f"truncated message: {len(data)} bytes, the single-object header alone is {HEADER_LEN}"
        )
    if data[:2] != MAGIC:
        raise CorruptRecordError(
            f"bad magic {bytes(data[:2]).hex()}, expected {MAGIC.hex()} (Avro single-object)"
        )
    return bytes(data[2:HEADER_LEN])


def read_body(data: Bytes, offset: int, writer: Any, reader: Any, what: str) -> dict[str, Any]:
    """Decode the Avro body of ``data`` starting at byte ``offset``; the whole rest must be used.

    ``reader`` None means "same as writer" (no resolution). ``what`` names the record in error
    messages. Raises CorruptRecordError for any undecodable or over-long body.
    """
    buf = BytesIO(data)
    buf.seek(offset)
    try:
        record = schemaless_reader(buf, writer, reader)
    # fastavro signals bad bytes with many types (EOFError, UnicodeDecodeError, IndexError,
    # ValueError, SchemaResolutionError...); all of them mean "this record is unreadable".
    except Exception as exc:
        raise CorruptRecordError(
            f"{what}: body not decodable ({type(exc).__name__}: {exc})"
        ) from exc
    trailing = len(data) - buf.tell()
    if trailing:
        raise CorruptRecordError(f"{what}: {trailing} trailing bytes after the record")
    if not isinstance(record, dict):
        raise CorruptRecordError(f"{what}: body is a {type(record).__name__}, not a record")
    return record


def _describe(name: str, verr: ValidationError) -> EncodeError:
    fields = "; ".join(
        f"field {err.field or name}: {err.datum!r} is not {err.schema!r}" for err in verr.errors
    )
    return EncodeError(f"{name}: {fields}")


def _encode_error(name: str, schema: Any, record: object, exc: Exception) -> EncodeError:
    """Name the offending field: fastavro's own writer errors rarely give the full path."""
    try:
        validate(record, schema, raise_errors=True)
    except ValidationError as verr:
        return _describe(name, verr)
    except Exception:  # noqa: S110 - validation itself choked; fall back to the writer's message
        pass
    return EncodeError(f"{name}: {type(exc).__name__}: {exc}")


def write_message(header: bytes, schema: Any, record: Mapping[str, Any], what: str) -> bytes:
    """``header`` followed by ``record`` written with the parsed ``schema``.

    Raises EncodeError naming the field at fault (``what`` names the record).
    """
    if not isinstance(record, Mapping):
        raise EncodeError(f"{what}: expected a mapping, got {type(record).__name__}")
    buf = BytesIO()
    buf.write(header)
    try:
        schemaless_writer(buf, schema, record)
    # The writer raises TypeError, ValueError, KeyError, AttributeError, struct.error or
    # OverflowError depending on the value; all mean "does not fit the schema".
    except Exception as exc:
        raise _encode_error(what, schema, record, exc) from exc
    return buf.getvalue()


class AvroCodec:
    """Encode and decode one schema (by name) in Avro single-object encoding.

    Thread-safe: no state changes after construction. ``fingerprint`` is the 8-byte
    fingerprint of the current schema, the one ``encode`` writes.
    """

    def __init__(self, schema_name: str, *, validate_on_encode: bool = False) -> None:
        """Build the codec from the shipped schemas (no I/O beyond the package files).

        ``validate_on_encode`` runs fastavro's full validation before each write, catching
        out-of-range ints and floats given for ints (the fast writer silently accepts both), at
        about a tenth of the speed. Raises UnknownSchemaError for an unknown name.
        """
        self.schema_name = schema_name
        self._writers = registry.writer_schemas(schema_name)
        self._schema = registry.current_schema(schema_name)
        self.fingerprint: bytes = registry.fingerprint(self._schema)
        self._header = MAGIC + self.fingerprint
        self._validate = validate_on_encode
        # fingerprint -> (version, writer schema, reader schema or None when no resolution)
        self._readers: dict[bytes, tuple[str, Any, Any]] = {
            fp: (version, parsed, None if fp == self.fingerprint else self._schema)
            for fp, (version, parsed) in self._writers.items()
        }
        # The current schema compiled to straight-line Python (2-4x faster than fastavro on our
        # wide records); fastavro stays for validation, resolution of older versions and any
        # schema the compiler does not handle.
        wire: Any = registry.strip_logical_types(registry.raw_schema(schema_name))
        try:
            self._encode_body: Any = compile_encoder(wire)
            self._decode_body: Any = compile_decoder(wire)
        except Unsupported:
            self._encode_body = self._decode_body = None
        # The C reader (about 10x the generated one) when it is built and not turned off.
        if self._decode_body is not None:
            self._decode_body = native_decoder(wire) or self._decode_body

    @property
    def known_fingerprints(self) -> frozenset[bytes]:
        """Fingerprints of every version this codec decodes (current and released)."""
        return frozenset(self._readers)

    @property
    def compiled_decoder(self) -> Any:
        """``(buffer, offset) -> (record, end)`` for bodies of the current schema (the C reader
        when built, else generated Python), or None when the schema is outside that subset.
        Raises plain errors on bad bytes."""
        return self._decode_body

    @property
    def schema(self) -> Any:
        """The current schema, parsed, in wire form. Shared: do not mutate."""
        return self._schema

    def encode(self, record: Mapping[str, Any]) -> bytes:
        """Encode ``record`` with the current schema; times are int ms.

        Fields with a default may be left out. Raises EncodeError (naming the field where
        fastavro can tell) when a value does not fit the schema.
        """
        if self._validate:
            try:
                validate(record, self._schema, raise_errors=True)
            except ValidationError as exc:
                raise _describe(self.schema_name, exc) from exc
        if self._encode_body is not None and isinstance(record, Mapping):
            try:
                body: bytes = self._encode_body(record)
                return self._header + body
            except Exception:  # noqa: S110 - fastavro below re-encodes and names the field at fault
                pass
        return write_message(self._header, self._schema, record, self.schema_name)

    def current_body(self, data: Bytes) -> Bytes | None:
        """The Avro body of a message written with the current schema (header stripped),
        None for a message of another version or that is not single-object encoded."""
        if len(data) < HEADER_LEN or data[:HEADER_LEN] != self._header:
            return None
        return data[HEADER_LEN:]

    def decode(self, data: Bytes) -> dict[str, Any]:
        """Decode one message written with the current or any released version of the schema.

        The result follows the current schema (fields added since are filled from defaults).
        Raises UnknownSchemaError for a fingerprint of no known version (message gives it in
        hex) and CorruptRecordError for bad magic, truncated or undecodable bytes.
        """
        fp = split_header(data)
        entry = self._readers.get(fp)
        if entry is None:
            raise UnknownSchemaError(
                f"{self.schema_name}: unknown writer schema fingerprint {fp.hex()} "
                f"(known: {', '.join(f.hex() for f in self._readers)})"
            )
        version, writer, reader = entry
        if reader is None and self._decode_body is not None:
            return self._decode_compiled(data, version)
        return read_body(data, HEADER_LEN, writer, reader, f"{self.schema_name} ({version})")

    def _decode_compiled(self, data: Bytes, version: str) -> dict[str, Any]:
        what = f"{self.schema_name} ({version})"
        try:
            record, end = self._decode_body(data, HEADER_LEN)
        # The generated reader signals bad bytes as IndexError (truncated), ValueError (bad
        # varint, union branch, length, boolean), KeyError/struct.error or UnicodeDecodeError.
        except Exception as exc:
            raise CorruptRecordError(
                f"{what}: body not decodable ({type(exc).__name__}: {exc})"
            ) from exc
        trailing = len(data) - end
        if trailing:
            raise CorruptRecordError(f"{what}: {trailing} trailing bytes after the record")
        return record  # type: ignore[no-any-return]

    def decode_many(self, messages: Iterable[Bytes]) -> list[dict[str, Any]]:
        """Decode several messages; raises on the first bad one, like ``decode``."""
        decode = self.decode
        return [decode(message) for message in messages]


class AvroMultiCodec:
    """Decode messages of several schemas, telling them apart by fingerprint."""

    def __init__(self, schema_names: Iterable[str] = registry.SCHEMA_NAMES) -> None:
        """Raises UnknownSchemaError for an unknown name."""
        self._codecs = {name: AvroCodec(name) for name in schema_names}
        self._by_fingerprint: dict[bytes, AvroCodec] = {}
        for codec in self._codecs.values():
            for fp in codec.known_fingerprints:
                self._by_fingerprint[fp] = codec

    def codec(self, schema_name: str) -> AvroCodec:
        """The single-schema codec for ``schema_name``; raises UnknownSchemaError if absent."""
        try:
            return self._codecs[schema_name]
        except KeyError:
            raise UnknownSchemaError(f"{schema_name!r} is not handled by this codec") from None

    def decode_any(self, data: Bytes) -> tuple[str, dict[str, Any]]:
        """Decode a message of any handled schema; returns ``(schema name, record)``.

        Raises UnknownSchemaError and CorruptRecordError like ``AvroCodec.decode``.
        """
        fp = split_header(data)
        codec = self._by_fingerprint.get(fp)
        if codec is None:
            raise UnknownSchemaError(f"unknown writer schema fingerprint {fp.hex()}")
        return codec.schema_name, codec.decode(data)


@functools.cache
def codec_for(schema_name: str) -> AvroCodec:
    """A shared AvroCodec for ``schema_name`` (built once). Raises UnknownSchemaError."""
    return AvroCodec(schema_name)


@functools.cache
def _default_multi() -> AvroMultiCodec:
    return AvroMultiCodec()


def decode_any(data: Bytes) -> tuple[str, dict[str, Any]]:
    """Decode a message of any peerwatch schema; returns ``(schema name, record)``.

    Raises UnknownSchemaError and CorruptRecordError like ``AvroCodec.decode``.
    """
    return _default_multi().decode_any(data)
