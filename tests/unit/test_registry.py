"""Schema loading, wire form and fingerprints, checked against the Apache Avro test vectors."""

from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

import pytest

from peerwatch.errors import UnknownSchemaError
from peerwatch.schemas import registry

SCHEMA_DIR = pathlib.Path(registry.__file__).parent
VECTORS = pathlib.Path(__file__).parents[1] / "data" / "avro" / "schema-tests.txt"


@dataclass(frozen=True)
class Vector:
    number: int
    schema_json: str
    canonical: str
    fingerprint: int | None


def parse_vectors(text: str) -> list[Vector]:
    """The ``<<INPUT`` / ``<<canonical`` / ``<<fingerprint`` blocks, heredoc inputs included."""
    vectors: list[Vector] = []
    lines = text.splitlines()
    pending: dict[str, str] = {}

    def flush() -> None:
        if pending:
            fp = pending.get("fingerprint")
            fp_int = int(fp) if fp is not None else None
            vectors.append(Vector(len(vectors), pending["input"], pending["canonical"], fp_int))
            pending.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("<<INPUT"):
            flush()
            rest = line.removeprefix("<<INPUT").strip()
            if rest:
                pending["input"] = rest
            else:  # heredoc: the schema runs until a line reading INPUT
                body: list[str] = []
                i += 1
                while lines[i] != "INPUT":
                    body.append(lines[i])
                    i += 1
                pending["input"] = "\n".join(body)
        elif line.startswith("<<canonical "):
            pending["canonical"] = line.removeprefix("<<canonical ")
        elif line.startswith("<<fingerprint "):
            pending["fingerprint"] = line.removeprefix("<<fingerprint ").strip()
        i += 1
    flush()
    return vectors


ALL_VECTORS = parse_vectors(VECTORS.read_text(encoding="utf-8"))


def test_vector_file_parsed_completely() -> None:
    text = VECTORS.read_text(encoding="utf-8")
    inputs = [ln for ln in text.splitlines() if ln.startswith("<<INPUT")]
    assert len(ALL_VECTORS) == len(inputs) == 34
    heredocs = [v for v in ALL_VECTORS if "\n" in v.schema_json]
    assert len(heredocs) == 2  # cases 026 and 033
    assert sum(v.fingerprint is not None for v in ALL_VECTORS) == 26


@pytest.mark.parametrize("vector", ALL_VECTORS, ids=lambda v: f"case{v.number:02d}")
def test_canonical_form_matches_avro(vector: Vector) -> None:
    # fastavro agrees with Java Avro on every canonical form in the file (none to exclude).
    assert registry.canonical_form(json.loads(vector.schema_json)) == vector.canonical


@pytest.mark.parametrize(
    "vector",
    [v for v in ALL_VECTORS if v.fingerprint is not None],
    ids=lambda v: f"case{v.number:02d}",
)
def test_fingerprint_matches_avro(vector: Vector) -> None:
    assert vector.fingerprint is not None
    fp = registry.fingerprint(json.loads(vector.schema_json))
    assert len(fp) == 8
    assert registry.fingerprint_to_int(fp) == vector.fingerprint
    # The single-object header carries the same value as little-endian bytes.
    assert fp == vector.fingerprint.to_bytes(8, "little", signed=True)


def test_logical_type_does_not_change_fingerprint() -> None:
    long_fp = -3434872931120570953  # "long" in the Avro vectors
    ts = {"type": "long", "logicalType": "timestamp-millis"}
    assert registry.canonical_form(ts) == '"long"'
    assert registry.fingerprint_to_int(registry.fingerprint(ts)) == long_fp


@pytest.mark.parametrize("name", registry.SCHEMA_NAMES)
def test_stripped_schema_keeps_fingerprint(name: str) -> None:
    raw = registry.raw_schema(name)
    assert "logicalType" in json.dumps(raw)  # every schema has a timestamp-millis field
    stripped = registry.strip_logical_types(raw)
    assert "logicalType" not in json.dumps(stripped)
    assert registry.fingerprint(raw) == registry.fingerprint(stripped)
    assert registry.fingerprint(raw) == registry.fingerprint(registry.current_schema(name))


def test_schema_names_are_the_shipped_files() -> None:
    files = sorted(p.stem for p in SCHEMA_DIR.glob("*.avsc"))
    assert list(registry.SCHEMA_NAMES) == files
    assert "NodeGpuSample" in registry.SCHEMA_NAMES


@pytest.mark.parametrize("name", registry.SCHEMA_NAMES)
def test_current_schema_is_parsed_wire_form(name: str) -> None:
    parsed = registry.current_schema(name)
    assert parsed["name"] == f"io.peerwatch.{name}"
    assert parsed.get("__fastavro_parsed") is True
    assert "logicalType" not in json.dumps(
        {k: v for k, v in parsed.items() if k != "__named_schemas"}
    )


@pytest.mark.parametrize("name", registry.SCHEMA_NAMES)
def test_released_versions_listed_in_order(name: str) -> None:
    released = registry.released_schemas(name)
    assert [v for v, _ in released] == ["v1"]
    raw = json.loads((SCHEMA_DIR / "released" / f"{name}.v1.avsc").read_text(encoding="utf-8"))
    assert registry.fingerprint(released[0][1]) == registry.fingerprint(raw)
    index = registry.writer_schemas(name)
    assert registry.fingerprint(raw) in index


def test_writer_index_labels_current_version() -> None:
    index = registry.writer_schemas("StepTime")
    fp = registry.fingerprint(registry.current_schema("StepTime"))
    assert index[fp][0] == "current"  # v1 equals current today, current wins the label


def test_public_results_are_copies() -> None:
    first = registry.current_schema("StepTime")
    first["fields"].clear()
    raw = registry.raw_schema("StepTime")
    raw["name"] = "Mangled"
    assert registry.current_schema("StepTime")["fields"]
    assert registry.raw_schema("StepTime")["name"] == "StepTime"


def test_unknown_name_raises() -> None:
    with pytest.raises(UnknownSchemaError, match="NoSuchRecord"):
        registry.current_schema("NoSuchRecord")
    with pytest.raises(UnknownSchemaError):
        registry.released_schemas("../etc/passwd")


def test_strip_keeps_default_values_untouched() -> None:
    schema = {
        "type": "record",
        "name": "R",
        "fields": [
            {
                "name": "inner",
                "type": {
                    "type": "record",
                    "name": "I",
                    "fields": [{"name": "logicalType", "type": "string"}],
                },
                "default": {"logicalType": "kept"},
            },
            {"name": "t", "type": ["null", {"type": "long", "logicalType": "timestamp-millis"}]},
        ],
    }
    stripped = registry.strip_logical_types(schema)
    assert isinstance(stripped, dict)
    assert stripped["fields"][0]["default"] == {"logicalType": "kept"}
    assert stripped["fields"][1]["type"] == ["null", {"type": "long"}]
    assert schema["fields"][1]["type"][1]["logicalType"] == "timestamp-millis"  # type: ignore[index]
