"""The Avro contracts shipped in this package: loading, wire form and fingerprints.

``<Name>.avsc`` beside this module is the current version of a schema and
``released/<Name>.v<N>.avsc`` are the versions that have been published and may still be on
the wire. Everything here is loaded once and cached; the public functions hand out deep copies
so a caller cannot corrupt the cache.

Wire form: peerwatch records carry times as plain int milliseconds, never ``datetime``. The
parsed schemas this module returns therefore have every ``logicalType`` removed, so fastavro
neither converts on read nor requires ``datetime`` on write. The Parsing Canonical Form ignores
``logicalType``, so the fingerprint of the stripped schema equals that of the shipped one.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from importlib import resources
from typing import Any

from fastavro import parse_schema
from fastavro.schema import fingerprint as _fastavro_fingerprint
from fastavro.schema import to_parsing_canonical_form

from peerwatch.errors import UnknownSchemaError

# A schema as JSON gives it: a type name, a union list, or an object.
AvroSchema = str | list[Any] | dict[str, Any]

_RELEASED_DIR = "released"
_RELEASED_RE = re.compile(r"^(?P<name>[A-Za-z_][A-Za-z0-9_]*)\.v(?P<n>[0-9]+)\.avsc$")


def _package_files() -> Any:
    return resources.files(__package__ or "peerwatch.schemas")


def _discover_names() -> tuple[str, ...]:
    names = [
        entry.name.removesuffix(".avsc")
        for entry in _package_files().iterdir()
        if entry.is_file() and entry.name.endswith(".avsc")
    ]
    return tuple(sorted(names))


SCHEMA_NAMES: tuple[str, ...] = _discover_names()
"""Names of the current schemas (record names without namespace), sorted."""


def _check_name(name: str) -> None:
    if name not in SCHEMA_NAMES:
        raise UnknownSchemaError(f"no schema named {name!r}; known: {', '.join(SCHEMA_NAMES)}")


@functools.cache
def _raw_current(name: str) -> dict[str, Any]:
    _check_name(name)
    text = (_package_files() / f"{name}.avsc").read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


@functools.cache
def _raw_released(name: str) -> tuple[tuple[str, dict[str, Any]], ...]:
    _check_name(name)
    folder = _package_files() / _RELEASED_DIR
    found: list[tuple[int, dict[str, Any]]] = []
    for entry in folder.iterdir():
        match = _RELEASED_RE.match(entry.name)
        if match is None or match["name"] != name:
            continue
        found.append((int(match["n"]), json.loads(entry.read_text(encoding="utf-8"))))
    found.sort(key=lambda item: item[0])
    return tuple((f"v{n}", schema) for n, schema in found)


def raw_schema(name: str) -> dict[str, Any]:
    """The current schema ``name`` as JSON, exactly as shipped (with docs and logical types).

    Raises UnknownSchemaError when no schema has that name.
    """
    return copy.deepcopy(_raw_current(name))


def raw_released_schemas(name: str) -> list[tuple[str, dict[str, Any]]]:
    """The released versions of ``name`` as JSON, oldest first, as ``(version, schema)``.

    ``version`` is the file's tag, e.g. ``"v1"``. Raises UnknownSchemaError for an unknown name.
    """
    return copy.deepcopy(list(_raw_released(name)))


def strip_logical_types(schema: AvroSchema) -> AvroSchema:
    """A copy of ``schema`` without any ``logicalType`` attribute (the wire form used here).

    Default values are copied untouched: a record default may legitimately hold a field that
    happens to be called ``logicalType``.
    """
    if isinstance(schema, list):
        return [strip_logical_types(branch) for branch in schema]
    if isinstance(schema, dict):
        out: dict[str, Any] = {}
        for key, value in schema.items():
            if key == "logicalType":
                continue
            out[key] = copy.deepcopy(value) if key == "default" else strip_logical_types(value)
        return out
    return schema


def parse_wire_schema(schema: AvroSchema) -> Any:
    """Parse ``schema`` with fastavro after removing logical types (see the module docstring).

    Raises fastavro's SchemaParseException when the schema is not valid Avro.
    """
    return parse_schema(strip_logical_types(schema))


@functools.cache
def _parsed_current(name: str) -> Any:
    return parse_wire_schema(_raw_current(name))


@functools.cache
def _parsed_released(name: str) -> tuple[tuple[str, Any], ...]:
    return tuple((version, parse_wire_schema(raw)) for version, raw in _raw_released(name))


def current_schema(name: str) -> dict[str, Any]:
    """The current schema ``name`` parsed by fastavro in wire form (no logical types).

    Raises UnknownSchemaError when no schema has that name.
    """
    parsed: dict[str, Any] = copy.deepcopy(_parsed_current(name))
    return parsed


def released_schemas(name: str) -> list[tuple[str, dict[str, Any]]]:
    """The released versions of ``name``, oldest first, as ``(version, parsed wire schema)``.

    Raises UnknownSchemaError when no schema has that name.
    """
    return copy.deepcopy(list(_parsed_released(name)))


def canonical_form(schema: AvroSchema) -> str:
    """The Avro Parsing Canonical Form of ``schema`` (raw JSON or fastavro-parsed)."""
    form: str = to_parsing_canonical_form(schema)
    return form


def fingerprint(schema: AvroSchema) -> bytes:
    """The 8-byte CRC-64-AVRO fingerprint of the canonical form, little-endian.

    This is the byte string that follows ``C3 01`` in Avro single-object encoding.
    """
    # fastavro renders the CRC-64-AVRO value as hex already in little-endian byte order.
    return bytes.fromhex(_fastavro_fingerprint(canonical_form(schema), "CRC-64-AVRO"))


def fingerprint_to_int(fp: bytes) -> int:
    """The signed 64-bit integer Java's Avro reports for the 8-byte fingerprint ``fp``."""
    return int.from_bytes(fp, "little", signed=True)


@functools.cache
def _writer_index(name: str) -> dict[bytes, tuple[str, Any]]:
    index: dict[bytes, tuple[str, Any]] = {}
    # Released first, current last: when the current schema equals a released one, the entry
    # is labelled "current" and the codec skips schema resolution for it.
    for version, parsed in _parsed_released(name):
        index[fingerprint(parsed)] = (version, parsed)
    current = _parsed_current(name)
    index[fingerprint(current)] = ("current", current)
    return index


def writer_schemas(name: str) -> dict[bytes, tuple[str, Any]]:
    """Every version of ``name`` a record may have been written with, by fingerprint.

    Values are ``(version, parsed wire schema)`` where version is ``"current"`` or a released
    tag such as ``"v1"``. The parsed schemas are shared with the codec cache: do not mutate.
    Raises UnknownSchemaError when no schema has that name.
    """
    return dict(_writer_index(name))
