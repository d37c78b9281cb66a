"""Avro single-object codec: upstream vector, round trips, schema evolution, errors, fuzzing."""

from __future__ import annotations

import contextlib
import io
import json
import pathlib
from typing import Any

import pytest
from fastavro import schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from peerwatch.errors import CodecError, CorruptRecordError, EncodeError, UnknownSchemaError
from peerwatch.schemas import codec as codec_mod
from peerwatch.schemas import registry
from peerwatch.schemas.codec import MAGIC, AvroCodec, AvroMultiCodec, codec_for, decode_any

AVRO_DATA = pathlib.Path(__file__).parents[1] / "data" / "avro" / "messageV1"
# One hand-written realistic record per schema (values as seen on H100 nodes).
REALISTIC_JSON = AVRO_DATA.parents[1] / "records" / "realistic_records.json"


def realistic() -> dict[str, dict[str, Any]]:
    """A fresh copy of the realistic records, by schema name."""
    loaded: dict[str, dict[str, Any]] = json.loads(REALISTIC_JSON.read_text(encoding="utf-8"))
    return with_bytes(loaded)


def with_bytes(records: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``records`` with the WindowBatch's windows and columns (hex in the JSON file) as bytes."""
    for part in records["WindowBatch"]["parts"]:
        part["windows"] = [bytes.fromhex(w) for w in part["windows"]]
        if part.get("columns"):
            for field in ("node", "gpu_index", "uuid", "ints", "floats"):
                part["columns"][field] = bytes.fromhex(part["columns"][field])
    return records


REALISTIC = realistic()
TS_MS = REALISTIC["NodeGpuSample"]["ts_ms"]


def node_gpu_sample() -> dict[str, Any]:
    """A fresh 8-GPU NodeGpuSample with one XID event."""
    return realistic()["NodeGpuSample"]


# --- a hypothesis strategy for any record of a parsed (wire-form) schema -------------------

_PRIMS: dict[str, st.SearchStrategy[Any]] = {
    "null": st.none(),
    "boolean": st.booleans(),
    "int": st.integers(-(2**31), 2**31 - 1),
    "long": st.integers(-(2**63), 2**63 - 1),
    "float": st.floats(width=32, allow_nan=False),
    "double": st.floats(allow_nan=False),
    "string": st.text(max_size=20),
    "bytes": st.binary(max_size=20),
}


def values_of(schema: Any, named: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values that fit ``schema`` (fastavro-parsed; named types resolved through ``named``)."""
    if isinstance(schema, list):
        return st.one_of([values_of(branch, named) for branch in schema])
    if isinstance(schema, str):
        return _PRIMS[schema] if schema in _PRIMS else values_of(named[schema], named)
    kind = schema["type"]
    if kind == "record":
        return st.fixed_dictionaries(
            {f["name"]: values_of(f["type"], named) for f in schema["fields"]}
        )
    if kind == "enum":
        return st.sampled_from(schema["symbols"])
    if kind == "array":
        return st.lists(values_of(schema["items"], named), max_size=4)
    if kind == "map":
        return st.dictionaries(st.text(max_size=5), values_of(schema["values"], named), max_size=3)
    return values_of(kind, named)


def records_of(name: str) -> st.SearchStrategy[dict[str, Any]]:
    schema = registry.current_schema(name)
    return values_of(schema, schema["__named_schemas"])


any_message = st.sampled_from(registry.SCHEMA_NAMES).flatmap(
    lambda name: records_of(name).map(lambda rec: codec_for(name).encode(rec))
)

# --- the upstream vector -------------------------------------------------------------------


def test_upstream_single_object_message() -> None:
    schema_json = json.loads((AVRO_DATA / "test_schema.avsc").read_text(encoding="utf-8"))
    data = (AVRO_DATA / "test_message.bin").read_bytes()
    schema = registry.parse_wire_schema(schema_json)
    fp = codec_mod.split_header(data)
    assert fp == registry.fingerprint(schema_json)
    record = codec_mod.read_body(data, codec_mod.HEADER_LEN, schema, None, "TestMessage")
    # test_schema.avsc has no "scores" field (messageV1/README.md is wrong about that).
    assert record == {"id": 42, "name": "Bill", "tags": ["dog_lover", "cat_hater"]}
    # ...and our writer produces the very same bytes as the Java implementation.
    assert codec_mod.write_message(MAGIC + fp, schema, record, "TestMessage") == data


# --- round trips ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", registry.SCHEMA_NAMES)
def test_realistic_record_round_trip(name: str) -> None:
    codec = AvroCodec(name)
    data = codec.encode(REALISTIC[name])
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == codec.fingerprint == registry.fingerprint(registry.raw_schema(name))
    assert codec.decode(data) == REALISTIC[name]


def test_times_stay_int_milliseconds() -> None:
    decoded = codec_for("NodeGpuSample").decode(
        codec_for("NodeGpuSample").encode(node_gpu_sample())
    )
    assert decoded["ts_ms"] == TS_MS
    assert type(decoded["ts_ms"]) is int
    assert type(decoded["xids"][0]["ts_ms"]) is int
    action = codec_for("DrainRecommendation").decode(
        codec_for("DrainRecommendation").encode(REALISTIC["DrainRecommendation"])
    )
    assert type(action["expires_ms"]) is int


@pytest.mark.parametrize("name", registry.SCHEMA_NAMES)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_generated_records_round_trip(name: str, data: st.DataObject) -> None:
    record = data.draw(records_of(name))
    codec = codec_for(name)
    encoded = codec.encode(record)
    decoded = codec.decode(encoded)
    assert codec.encode(decoded) == encoded
    assert decoded.keys() == record.keys()


def test_defaults_fill_left_out_fields() -> None:
    minimal = {"action_id": "a", "node": "n1", "ts_ms": 5, "detail": "d"}
    decoded = codec_for("DrainAction").decode(codec_for("DrainAction").encode(minimal))
    assert decoded["decision"] == "UNKNOWN"
    assert decoded["recommendation_id"] is None


def test_decode_many_and_buffer_types() -> None:
    codec = codec_for("StepTime")
    data = codec.encode(REALISTIC["StepTime"])
    assert codec.decode(bytearray(data)) == REALISTIC["StepTime"]
    assert codec.decode(memoryview(data)) == REALISTIC["StepTime"]
    assert codec.decode_many([data, data]) == [REALISTIC["StepTime"]] * 2


def test_decode_any_tells_schemas_apart() -> None:
    for name, record in REALISTIC.items():
        assert decode_any(codec_for(name).encode(record)) == (name, record)
    only_steps = AvroMultiCodec(["StepTime"])
    with pytest.raises(UnknownSchemaError):
        only_steps.decode_any(codec_for("JobEvent").encode(REALISTIC["JobEvent"]))
    with pytest.raises(UnknownSchemaError):
        only_steps.codec("JobEvent")


# --- released versions and evolution -------------------------------------------------------


def as_released(value: Any, old: Any, new: Any) -> Any:
    """``value`` (of the current type ``new``) as a reader of ``new`` sees it written with the
    released type ``old``: the fields ``old`` lacks hold their defaults, at any depth."""
    if isinstance(new, dict) and new.get("type") == "record":
        old_fields = {f["name"]: f["type"] for f in old["fields"]}
        return {f["name"]: as_released(value[f["name"]], old_fields[f["name"]], f["type"])
                if f["name"] in old_fields else f["default"]
                for f in new["fields"]}  # fmt: skip
    if isinstance(new, dict) and new.get("type") == "array":
        return [as_released(v, old["items"], new["items"]) for v in value]
    if isinstance(new, list) and isinstance(value, dict):  # a union's record branch
        [new_branch] = [t for t in new if isinstance(t, dict) and t.get("type") == "record"]
        [old_branch] = [t for t in old if isinstance(t, dict) and t.get("type") == "record"]
        return as_released(value, old_branch, new_branch)
    return value


@pytest.mark.parametrize("name", registry.SCHEMA_NAMES)
def test_released_version_record_decodes_with_current_codec(name: str) -> None:
    for _version, released in registry.released_schemas(name):
        buf = io.BytesIO()
        buf.write(MAGIC + registry.fingerprint(released))
        schemaless_writer(buf, released, REALISTIC[name])
        # Fields added since that version read as their defaults, nested ones too.
        expected = as_released(REALISTIC[name], released, registry.raw_schema(name))
        assert AvroCodec(name).decode(buf.getvalue()) == expected


def test_older_writer_is_resolved_into_current(monkeypatch: pytest.MonkeyPatch) -> None:
    """A version without ``gpu_index`` and with ``rank`` as int stands in for a future change."""
    old_raw = registry.raw_schema("StepTime")
    old_raw["fields"] = [f for f in old_raw["fields"] if f["name"] != "gpu_index"]
    old = registry.parse_wire_schema(old_raw)
    real_index = registry.writer_schemas

    def with_old(name: str) -> dict[bytes, tuple[str, Any]]:
        return {**real_index(name), registry.fingerprint(old): ("v0", old)}

    monkeypatch.setattr(registry, "writer_schemas", with_old)
    codec = AvroCodec("StepTime")
    old_record = {k: v for k, v in REALISTIC["StepTime"].items() if k != "gpu_index"}
    buf = io.BytesIO(MAGIC + registry.fingerprint(old))
    buf.seek(0, io.SEEK_END)
    schemaless_writer(buf, old, old_record)
    assert codec.decode(buf.getvalue()) == {**old_record, "gpu_index": None}
    assert codec.encode(old_record)[2:10] == codec.fingerprint  # always writes current


# --- errors --------------------------------------------------------------------------------


def test_short_message_is_corrupt() -> None:
    with pytest.raises(CorruptRecordError, match="truncated"):
        codec_for("StepTime").decode(b"\xc3\x01\x00")


def test_bad_magic_is_corrupt() -> None:
    data = codec_for("StepTime").encode(REALISTIC["StepTime"])
    with pytest.raises(CorruptRecordError, match="bad magic 0001"):
        codec_for("StepTime").decode(b"\x00\x01" + data[2:])


def test_unknown_fingerprint_names_it() -> None:
    data = codec_for("StepTime").encode(REALISTIC["StepTime"])
    with pytest.raises(UnknownSchemaError, match="0102030405060708"):
        codec_for("StepTime").decode(MAGIC + bytes(range(1, 9)) + data[10:])
    other = codec_for("JobEvent").encode(REALISTIC["JobEvent"])
    with pytest.raises(UnknownSchemaError, match=other[2:10].hex()):
        codec_for("StepTime").decode(other)


def test_trailing_bytes_are_corrupt() -> None:
    data = codec_for("StepTime").encode(REALISTIC["StepTime"])
    with pytest.raises(CorruptRecordError, match="1 trailing"):
        codec_for("StepTime").decode(data + b"\x00")


@pytest.mark.parametrize("name", registry.SCHEMA_NAMES)
def test_every_truncation_is_corrupt(name: str) -> None:
    # Avro binary is prefix-free for a fixed schema: no strict prefix is a whole record.
    data = codec_for(name).encode(REALISTIC[name])
    for cut in range(len(data)):
        with pytest.raises(CorruptRecordError):
            codec_for(name).decode(data[:cut])


def _bad_gpu_sample(**changes: Any) -> dict[str, Any]:
    record = node_gpu_sample()
    record["gpus"][2].update(changes)
    return record


@pytest.mark.parametrize(
    ("record", "field"),
    [
        (_bad_gpu_sample(sm_clock_mhz="fast"), "sm_clock_mhz"),
        (_bad_gpu_sample(state="MELTED"), "state"),
        (_bad_gpu_sample(uuid=None), "uuid"),
        ({k: v for k, v in node_gpu_sample().items() if k != "node"}, "node"),
        ({**node_gpu_sample(), "ts_ms": "2024-11-29T10:20:00Z"}, "ts_ms"),
    ],
)
def test_encode_error_names_the_field(record: dict[str, Any], field: str) -> None:
    with pytest.raises(EncodeError, match=field):
        codec_for("NodeGpuSample").encode(record)


def test_encode_rejects_non_mapping() -> None:
    with pytest.raises(EncodeError, match="mapping"):
        codec_for("StepTime").encode([1, 2])  # type: ignore[arg-type]


def test_validating_codec_catches_out_of_range_int() -> None:
    record = {**REALISTIC["StepTime"], "rank": 2**40}
    with pytest.raises(EncodeError, match="rank"):
        AvroCodec("StepTime", validate_on_encode=True).encode(record)
    assert AvroCodec("StepTime", validate_on_encode=True).encode(REALISTIC["StepTime"])


def test_unknown_schema_name() -> None:
    with pytest.raises(UnknownSchemaError):
        AvroCodec("Nope")


# --- fuzzing: bad bytes only ever raise CodecError subclasses -------------------------------


def _decode_or_codec_error(data: bytes) -> None:
    name = "NodeGpuSample"
    try:
        record = codec_for(name).decode(data)
    except CodecError:
        return
    assert isinstance(record, dict)
    codec_for(name).encode(record)  # whatever decodes validly must also encode


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes(data: bytes) -> None:
    _decode_or_codec_error(data)
    with contextlib.suppress(CodecError):
        decode_any(data)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(registry.SCHEMA_NAMES), st.binary(max_size=300))
def test_random_body_behind_valid_header(name: str, body: bytes) -> None:
    codec = codec_for(name)
    try:
        record = codec.decode(MAGIC + codec.fingerprint + body)
    except CodecError:
        return
    # Not byte-equal to the input: over-long varints and booleans other than 01 still decode.
    again = codec.encode(record)
    assert codec.encode(codec.decode(again)) == again


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(any_message, st.data())
def test_bit_flips_and_truncations(message: bytes, data: st.DataObject) -> None:
    damaged = bytearray(message)
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(0, len(damaged) - 1))
        damaged[pos] ^= 1 << data.draw(st.integers(0, 7))
    damaged = damaged[: data.draw(st.integers(0, len(damaged)))]
    try:
        name, record = decode_any(bytes(damaged))
    except CodecError:
        return
    assert isinstance(record, dict)
    assert name in registry.SCHEMA_NAMES
