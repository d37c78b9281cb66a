"""One archived record with two faults (issue 39 item 8): invalid UTF-8 and, later in the same
record, a long over 64 bits or a boolean byte 02. The C column reader ended the block there (the
default replay kept 90 samples, 0 findings) while the decoded path skipped only the record (599
samples, 2 findings). Now every path skips that one record, counts it, and keeps the rest."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_archive_names import SAMPLES, SCENARIO, T0  # a job with one slow GPU, 10 minutes

from peerwatch.io.archive.layout import ReadStats
from peerwatch.io.archive.reader import lax_skipper, lenient_skipper, read_file
from peerwatch.io.archive.writer import ContainerWriter, body_encoder
from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.publish import write_archive
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.schemas.compiled import encode_long
from peerwatch.schemas.registry import current_schema, raw_schema, strip_logical_types
from peerwatch.streams.offline.replay import TimeRange, archive_records, column_archive_records
from peerwatch.streams.offline.sample_runs import (
    SAMPLE_RUN,
    decoded_here,
    file_tables,
    sample_decoder,
)

SPAN = TimeRange(T0, T0 + 3_600_000)
MARK = "550.90.07"
#: A sentinel power (mW) on GPU 0, found in the encoded bytes and overwritten there.
SENTINEL = 123_456_789_012
OVER_64_BITS = b"\xff" * 9 + b"\x02"  # a varint ending at its 10th byte, beyond 64 bits

Mutate = Callable[[bytes], bytes]


def _utf8(body: bytes) -> bytes:
    assert body.count(MARK.encode()) == 1
    return body.replace(MARK.encode(), b"550\xff90.07")


def _long(body: bytes) -> bytes:
    sentinel = b"\x02" + encode_long(SENTINEL)  # union branch 1, then the long
    assert body.count(sentinel) == 1
    return body.replace(sentinel, b"\x02" + OVER_64_BITS)


def _bool(body: bytes) -> bytes:
    # remap_pending, remap_failed (both [null, boolean], True) then pcie_replay_count (long)
    run = b"\x02\x01\x02\x01\x02" + encode_long(SENTINEL + 1)
    assert body.count(run) == 1
    return body.replace(run, b"\x02\x02" + run[2:])


FAULTS: dict[str, list[Mutate]] = {
    "utf8 then a long over 64 bits": [_utf8, _long],
    "utf8 then a boolean byte 02": [_utf8, _bool],
    "a long over 64 bits": [_long],
    "a boolean byte 02": [_bool],
}


def _marked(record: dict[str, Any]) -> dict[str, Any]:
    gpu = dict(record["gpus"][0])
    gpu.update(power_mw=SENTINEL, remap_pending=True, remap_failed=True,
               pcie_replay_count=SENTINEL + 1)  # fmt: skip
    return {**record, "driver_version": MARK, "gpus": [gpu, *record["gpus"][1:]]}


def write_hour(root: Path, faults: list[Mutate], at: int = 5) -> tuple[int, int]:
    """The scenario's archive with the samples hour rewritten: one record (``at`` of its
    block, the hour's 3rd block) carrying ``faults``; returns (samples, records per block)."""
    write_archive(Fleet(parse_scenario(SCENARIO)), root)
    path = root / SAMPLES / "2026-01-01T00.avro"
    schema = current_schema("NodeGpuSample")
    records = list(read_file(path, schema))
    per_block = 20
    encode = body_encoder("NodeGpuSample")
    with path.open("wb") as fh:
        w = ContainerWriter(fh, strip_logical_types(raw_schema("NodeGpuSample")), encode, "null",
                            b"S" * 16, block_bytes=1 << 30)  # fmt: skip
        for i, rec in enumerate(records):
            if i == 2 * per_block + at:
                body = encode(_marked(rec))
                for fault in faults:
                    body = fault(body)
            else:
                body = encode(rec)
            w.write_body(body)
            if (i + 1) % per_block == 0:
                w.flush()
        w.flush()
    return len(records), per_block


def _decoded(root: Path, stats: ReadStats) -> int:
    return sum(1 for s, *_ in archive_records(root, SPAN, stats=stats) if s == "samples")


def _workers(root: Path, stats: ReadStats) -> int:
    records = archive_records(root, SPAN, workers=2, part_bytes=4096, stats=stats)
    return sum(1 for s, *_ in records if s == "samples")


def _columns(root: Path, stats: ReadStats) -> int:
    runs = column_archive_records(root, SPAN, {}, stats=stats)
    return sum(v[""].n for s, _, v in runs if s == SAMPLE_RUN)


def _file_tables(root: Path, stats: ReadStats) -> int:
    paths = [root / SAMPLES / "2026-01-01T00.avro"]
    return sum(t[""].n for t in file_tables(paths, decoded_here(sample_decoder()), {}, stats))


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_record_with_value_faults_is_skipped_alone_on_every_path(
    tmp_path: Path, fault: str
) -> None:
    total, _ = write_hour(tmp_path, FAULTS[fault])
    got = {}
    for name, read in [("decoded", _decoded), ("workers", _workers), ("columns", _columns),
                       ("file_tables", _file_tables)]:  # fmt: skip
        stats = ReadStats()
        got[name] = (read(tmp_path, stats), stats.as_dict())
    assert len(set(map(str, got.values()))) == 1, got
    kept, stats = got["decoded"]
    assert kept == total - 1 and stats["bad_records"] == 1 and stats["bad_blocks"] == 0


@pytest.mark.parametrize("mode", [[], ["--workers", "2"]])
def test_replay_modes_agree_on_an_archive_with_a_two_fault_record(
    tmp_path: Path, mode: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from peerwatch.cli import main

    total, _ = write_hour(tmp_path, FAULTS["utf8 then a long over 64 bits"])
    assert main(["replay", "--archive", str(tmp_path), "--no-progress", *mode]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["node_records"] == total - 1 and summary["bad_records"] == 1
    assert summary["findings"] > 0


def test_the_python_and_c_lenient_skips_end_records_alike() -> None:
    schema = strip_logical_types(raw_schema("NodeGpuSample"))
    native, python = lenient_skipper(schema), lax_skipper(schema)
    fleet = Fleet(parse_scenario(SCENARIO))
    record = next(r.value for _, recs in fleet.timed_ticks() for r in recs if r.stream == "samples")
    body = body_encoder("NodeGpuSample")(_marked(record))
    for faults in FAULTS.values():
        bad = body
        for fault in faults:
            bad = fault(bad)
        assert native(bad, 0) == python(bad, 0) == len(bad)
    # An 11-byte varint (a continuation bit on its 10th byte) leaves the end unknown: refused.
    eleven = _long(body).replace(OVER_64_BITS, b"\xff" * 10 + b"\x01")
    for skip in (native, python):
        with pytest.raises(ValueError):
            skip(eleven, 0)
