"""A worker of this version reads records written with the released schemas (schemas/released/),
through the decode paths the live worker uses: the hot stage's columns
(:class:`~peerwatch.schemas.columns.MessageColumns`: the C decoder for the current version, the
codec's resolution for any other), the stage-3/4 codecs and the WindowBatch codec.

The bytes are written with the released schema file itself (fastavro, its own fingerprint), not
with the current one. Today v1 equals the current schema; a stand-in older version (one field
fewer) takes the path a record of the previous release takes once the schema changes: docs/
upgrading.md, "Schema changes" (consumers before producers).
"""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastavro import schemaless_writer
from test_codec import as_released

from peerwatch.schemas import registry
from peerwatch.schemas.codec import MAGIC, AvroCodec, decode_any
from peerwatch.schemas.columns import MessageColumns, Table, tables_from_records
from peerwatch.streams.core.windows import SAMPLE_SPEC
from peerwatch.streams.live.window_batches import WindowBatchCodec

RECORDS = Path(__file__).parents[1] / "data" / "records" / "realistic_records.json"
#: What the stream worker's handlers and the exporters decode with AvroCodec / decode_any.
STAGE_SCHEMAS = ("JobEvent", "StepTime", "HealthCheckResult", "NodeStateEvent", "GpuWindow",
                 "StragglerFinding", "DrainRecommendation", "DrainAction")  # fmt: skip


def realistic() -> dict[str, dict[str, Any]]:
    records: dict[str, dict[str, Any]] = json.loads(RECORDS.read_text(encoding="utf-8"))
    for part in records["WindowBatch"]["parts"]:
        part["windows"] = [bytes.fromhex(w) for w in part["windows"]]
        if part.get("columns"):
            for field in ("node", "gpu_index", "uuid", "ints", "floats"):
                part["columns"][field] = bytes.fromhex(part["columns"][field])
    return records


def written_with(schema: dict[str, Any], record: dict[str, Any]) -> bytes:
    """``record`` as a producer of that schema version writes it (single-object encoding)."""
    buf = io.BytesIO()
    buf.write(MAGIC + registry.fingerprint(schema))
    schemaless_writer(buf, schema, record)
    return buf.getvalue()


def released(name: str) -> list[tuple[str, dict[str, Any]]]:
    versions = registry.released_schemas(name)
    assert versions, f"{name}: no released version in schemas/released/"
    return versions


def assert_same_tables(got: dict[str, Table], want: dict[str, Table]) -> None:
    assert got.keys() == want.keys()
    for level, table in want.items():
        assert got[level].n == table.n, level
        for column, values in table.values.items():
            np.testing.assert_array_equal(got[level].values[column], values, err_msg=column)
        for column, valid in table.valid.items():
            np.testing.assert_array_equal(got[level].valid[column], valid, err_msg=column)


def test_hot_stage_reads_released_samples() -> None:
    sample = realistic()["NodeGpuSample"]
    current = AvroCodec("NodeGpuSample").encode(sample)
    for version, schema in released("NodeGpuSample"):
        old = written_with(schema, sample)
        strings: dict[str, int] = {}
        tables, rows, bad = MessageColumns("NodeGpuSample", SAMPLE_SPEC).decode(
            [old, current], strings
        )
        assert bad == [], version
        assert rows.tolist() == [0, 1]
        want = tables_from_records(SAMPLE_SPEC, [sample, sample], strings)
        assert_same_tables(tables, want)


def previous_sample_version() -> dict[str, Any]:
    """NodeGpuSample as a release before ``sm_active_pct`` was added would have it."""
    schema = copy.deepcopy(registry.released_schemas("NodeGpuSample")[-1][1])
    gpu = schema["fields"][6]["type"]["items"]
    assert gpu["name"] == "io.peerwatch.GpuReading" or gpu["name"].endswith("GpuReading")
    gpu["fields"] = [f for f in gpu["fields"] if f["name"] != "sm_active_pct"]
    return schema


def test_hot_stage_resolves_a_sample_of_an_older_version(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    old_schema = previous_sample_version()
    old_parsed = registry.parse_wire_schema(old_schema)
    real_index = registry.writer_schemas

    def with_old(name: str) -> dict[bytes, tuple[str, Any]]:
        extra = (
            {registry.fingerprint(old_parsed): ("v0", old_parsed)}
            if name == "NodeGpuSample"
            else {}
        )
        return {**real_index(name), **extra}

    monkeypatch.setattr(registry, "writer_schemas", with_old)
    sample = realistic()["NodeGpuSample"]
    old_record = copy.deepcopy(sample)
    for gpu in old_record["gpus"]:
        del gpu["sm_active_pct"]
    columns = MessageColumns("NodeGpuSample", SAMPLE_SPEC)
    columns.codec = AvroCodec("NodeGpuSample")  # built after the patch: knows "v0"
    strings: dict[str, int] = {}
    old = written_with(old_schema, old_record)
    tables, rows, bad = columns.decode([old, AvroCodec("NodeGpuSample").encode(sample)], strings)
    assert bad == [] and rows.tolist() == [0, 1]
    # The field the old writer lacked reads as its default (null), the rest as written.
    expected_old = copy.deepcopy(sample)
    for gpu in expected_old["gpus"]:
        gpu["sm_active_pct"] = None
    assert_same_tables(tables, tables_from_records(SAMPLE_SPEC, [expected_old, sample], strings))
    gpus = tables["gpus."]
    n_old = len(sample["gpus"])
    assert not gpus.valid["sm_active_pct"][:n_old].any()
    assert gpus.valid["sm_active_pct"][n_old:].all()


@pytest.mark.parametrize("name", STAGE_SCHEMAS)
def test_stage_and_exporter_codecs_read_released_records(name: str) -> None:
    record = realistic()[name]
    for version, schema in released(name):
        old = written_with(schema, record)
        expected = as_released(record, schema, registry.raw_schema(name))
        assert AvroCodec(name).decode(old) == expected, version
        assert decode_any(old) == (name, expected), version


def test_window_batches_of_the_released_version_are_read() -> None:
    # Stage 3's input (a pending table written before an upgrade): WindowBatch messages holding
    # GpuWindow messages, both of the released version (GpuWindow v1 lacks thermal_frac,
    # power_brake_frac and fleet_clk_ratio; WindowBatch v1 has no columns).
    batch = realistic()["WindowBatch"]
    batch["parts"] = [p for p in batch["parts"] if p["windows"]]
    codec = WindowBatchCodec()
    want = codec.decode_batch(AvroCodec("WindowBatch").encode(batch))
    assert "batch" not in want and sum(map(len, want["parts"].values())) == 2
    [(_, window_schema)] = released("GpuWindow")[-1:]
    window_fields = {f["name"] for f in window_schema["fields"]}
    defaults = {f["name"]: f["default"] for f in registry.raw_schema("GpuWindow")["fields"]
                if f["name"] not in window_fields}  # fmt: skip
    for version, schema in released("WindowBatch"):
        old_batch = copy.deepcopy(batch)
        for part in old_batch["parts"]:
            part["windows"] = [
                written_with(window_schema, AvroCodec("GpuWindow").decode(w))
                for w in part["windows"]
            ]
        got = codec.decode_batch(written_with(schema, old_batch))
        expected = copy.deepcopy(want)
        for windows in expected["parts"].values():
            for w in windows:
                w.update(defaults)
        assert got == expected, version
