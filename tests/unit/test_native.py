"""The C decoder must give exactly what the generated Python reader gives: the same objects for
good bytes, an error (never a crash, never a different value) for bad bytes."""

from __future__ import annotations

import io
import os
import random
from typing import Any

import fastavro
import pytest
from fastavro.utils import generate_many
from test_compiled import SMALL, same

from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.scenario import default_scenario
from peerwatch.schemas import native, registry
from peerwatch.schemas.codec import HEADER_LEN, AvroCodec
from peerwatch.schemas.compiled import Unsupported, compile_decoder
from peerwatch.schemas.native import plan_of

# CI builds the module and sets PEERWATCH_REQUIRE_NATIVE=1: there a missing build is a failure,
# not a skip. Elsewhere (no compiler) these tests skip and say why.
if os.environ.get("PEERWATCH_REQUIRE_NATIVE") == "1":
    assert native.available(), "the C decoder was not built (pip install -e . needs gcc)"
pytestmark = pytest.mark.skipif(not native.available(), reason="C decoder not built")


def decoders(schema: Any) -> tuple[Any, Any]:
    return compile_decoder(schema), native.native_decoder(schema)


def outcome(decode: Any, data: bytes) -> tuple[str, Any]:
    try:
        return "ok", decode(data, 0)
    except (IndexError, ValueError, KeyError, UnicodeDecodeError) as exc:
        return "error", type(exc).__name__
    except Exception as exc:  # struct.error from the Python reader is a truncation too
        if type(exc).__name__ == "error":
            return "error", "struct.error"
        raise


@pytest.mark.parametrize("name", registry.SCHEMA_NAMES)
def test_native_matches_python_reader_on_generated_records(name: str) -> None:
    wire = registry.strip_logical_types(registry.raw_schema(name))
    py, c = decoders(wire)
    parsed = registry.current_schema(name)
    for record in generate_many(parsed, 150):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, record)
        data = buf.getvalue()
        got, end = c(data, 0)
        want, want_end = py(data, 0)
        assert end == want_end == len(data)
        assert same(got, want)


@pytest.mark.parametrize("name", registry.SCHEMA_NAMES)
def test_corrupted_bytes_fail_alike(name: str) -> None:
    """Truncations, flipped bytes and spliced garbage: both readers fail, or both read the same
    value and end at the same offset."""
    wire = registry.strip_logical_types(registry.raw_schema(name))
    py, c = decoders(wire)
    parsed = registry.current_schema(name)
    rng = random.Random(name)
    checked = errors = 0
    for record in generate_many(parsed, 40):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, record)
        good = buf.getvalue()
        variants = [good[:cut] for cut in sorted(rng.sample(range(len(good)), min(8, len(good))))]
        for _ in range(12):
            bad = bytearray(good)
            for _ in range(rng.randint(1, 3)):
                bad[rng.randrange(len(bad))] = rng.randrange(256)
            variants.append(bytes(bad))
        variants.append(good + bytes(rng.randrange(256) for _ in range(5)))
        for data in variants:
            want, got = outcome(py, data), outcome(c, data)
            assert want[0] == got[0], (data.hex(), want, got)
            if want[0] == "ok":
                assert same(got[1][0], want[1][0]) and got[1][1] == want[1][1]
            else:
                errors += 1
            checked += 1
    assert checked > 500 and errors > 100  # the corruption really exercised the error paths


def test_small_schema_maps_enums_named_references_and_reversed_unions() -> None:
    py, c = decoders(SMALL)
    record = {"a": 7, "b": {"k": 1.5, "n": None}, "c": "Y", "d": "X", "e": b"\x00\xff", "f": True}
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(SMALL), record)
    assert c(buf.getvalue(), 0) == py(buf.getvalue(), 0) == (record, len(buf.getvalue()))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "truncated"),
        (b"\x04", "bad union branch"),
        (b"\x02\x80", "truncated varint"),
        (b"\x00" + b"\xff" * 9 + b"\x02", "does not fit 64 bits"),
        (b"\x00\x00\x06\x00\x00\x01", "enum index"),
        (b"\x00\x00\x00\x00\x03\x01", "bad length"),
        (b"\x00\x01\x02\x01\x00\x00", "bad length"),
        (b"\x00\x7e", "block count"),
        (b"\x00\x00\x00\x00\x00\x07", "bad boolean"),
    ],
)
def test_malformed_bytes_name_the_fault(data: bytes, message: str) -> None:
    _, c = decoders(SMALL)
    with pytest.raises(ValueError, match=message):
        c(data, 0)


def test_long_range_and_floats() -> None:
    schema = {"type": "record", "name": "N", "fields": [
        {"name": "lo", "type": "long"}, {"name": "hi", "type": "long"},
        {"name": "f", "type": "float"}, {"name": "d", "type": "double"},
    ]}  # fmt: skip
    record = {"lo": -(1 << 63), "hi": (1 << 63) - 1, "f": 0.1, "d": -2.5e300}
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    py, c = decoders(schema)
    assert c(buf.getvalue(), 0) == py(buf.getvalue(), 0)
    assert c(buf.getvalue(), 0)[0]["hi"] == (1 << 63) - 1


def test_buffers_offsets_and_bad_plans() -> None:
    codec = AvroCodec("NodeGpuSample")
    fleet = Fleet(default_scenario(nodes=2, duration_s=3))
    record = [r.value for t in fleet.ticks() for r in t if r.stream == "samples"][-1]
    message = codec.encode(record)
    c = native.native_decoder(registry.strip_logical_types(registry.raw_schema("NodeGpuSample")))
    for buf in (message, bytearray(message), memoryview(message)):
        value, end = c(buf, HEADER_LEN)
        assert end == len(message) and value["node"] == record["node"]
    assert (
        codec.decode(message)
        == compile_decoder(registry.strip_logical_types(registry.raw_schema("NodeGpuSample")))(
            message, HEADER_LEN
        )[0]
    )
    with pytest.raises(ValueError, match="offset"):
        c(message, len(message) + 1)
    with pytest.raises(TypeError):
        native.native.decode((99, None, None), b"\x00", 0)
    with pytest.raises(TypeError):
        native.native.decode("not a plan", b"\x00", 0)
    deep: Any = (native.NULL, None, None)
    for _ in range(100):
        deep = (native.UNION, (deep,), None)
    with pytest.raises(ValueError, match="nested"):
        native.native.decode(deep, b"\x00" * 200, 0)


def test_plan_refuses_unknown_names() -> None:
    with pytest.raises(Unsupported):
        plan_of({"type": "record", "name": "R", "fields": [{"name": "x", "type": "Nope"}]})


@pytest.mark.parametrize("name", registry.SCHEMA_NAMES)
def test_skip_ends_where_decode_ends(name: str) -> None:
    wire = registry.strip_logical_types(registry.raw_schema(name))
    decode, skip = native.native_decoder(wire), native.native_skipper(wire)
    parsed = registry.current_schema(name)
    rng = random.Random(name + "skip")
    for record in generate_many(parsed, 60):
        buf = io.BytesIO()
        fastavro.schemaless_writer(buf, parsed, record)
        good = buf.getvalue()
        assert skip(good, 0) == len(good)
        assert skip(b"\x00" + good, 1) == len(good) + 1
        bad = bytearray(good)
        bad[rng.randrange(len(bad))] = rng.randrange(256)
        try:
            _, end = decode(bytes(bad), 0)
        except (ValueError, UnicodeDecodeError):
            with pytest.raises(ValueError):  # skip refuses what decode refuses
                skip(bytes(bad), 0)
            continue
        assert skip(bytes(bad), 0) == end
        with pytest.raises(ValueError):
            skip(good[: len(good) // 2], 0) if len(good) > 1 else skip(b"", 0)


def test_skip_refuses_what_decode_refuses() -> None:
    """scripts/fuzz_native.py found skip stepping over enum indexes out of range that decode
    refuses; skip checks the UTF-8 of strings too (a sample with a bad string is one bad record
    whether or not its fields are read)."""
    plan = (native.ENUM, ("A", "B"), None)
    for data in (b"\x04", b"\x01", b"\xfe\xff\xff\xff\xff\xff\xff\xff\xff\x01"):
        for fn in (native.native.skip, native.native.decode):
            with pytest.raises(ValueError, match="enum index"):
                fn(plan, data, 0)
    assert native.native.skip(plan, b"\x00\x02", 1) == 2
    with pytest.raises(TypeError):
        native.native.skip((native.ENUM, None, None), b"\x00", 0)
    nested = plan_of({"type": "record", "name": "R", "fields": [
        {"name": "e", "type": ["null", {"type": "enum", "name": "E", "symbols": ["A"]}]}]})  # fmt: skip
    assert native.native.skip(nested, b"\x02\x00", 0) == 2
    with pytest.raises(ValueError, match="enum index"):
        native.native.skip(nested, b"\x02\x02", 0)
    string = (native.STRING, None, None)
    assert native.native.skip(string, b"\x04\xc3\xa9", 0) == 3
    for fn in (native.native.skip, native.native.decode):
        for data in (b"\x02\xff", b"\x06\xed\xa0\x80", b"\x04\xc0\x80", b"\x08\xf4\x90\x80\x80"):
            with pytest.raises(ValueError):
                fn(string, data, 0)
    with pytest.raises(UnicodeDecodeError):
        native.native.decode(string, b"\x02\xff", 0)
