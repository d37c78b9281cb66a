"""Hostile archive bytes (issue 12 items 1 and 3): corrupt headers, block sizes and records are
refused or skipped and counted, never a hang or a read of a corrupted size; the records around
them are kept, and the decoded and column readers give the same answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import fastavro
import pytest

from peerwatch.io.archive.layout import ReadStats
from peerwatch.io.archive.reader import block_spans, lax_skipper, raw_blocks, read_file, split_file
from peerwatch.io.archive.writer import ContainerWriter, body_encoder
from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.publish import write_archive
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.schemas.compiled import encode_long
from peerwatch.schemas.registry import current_schema, raw_schema, strip_logical_types
from peerwatch.streams.offline.replay import TimeRange, archive_records, column_archive_records
from peerwatch.streams.offline.sample_runs import decoded_here, file_tables, sample_decoder

T0 = 1_767_225_600_000
SPAN = TimeRange(T0, T0 + 3_600_000)
SCENARIO = {
    "fleet": {"nodes": 4, "gpus_per_node": 2, "interval_s": 10.0, "duration_s": 200, "seed": 3},
    "jobs": [],
    "faults": [],
}
SAMPLES = "peerwatch.gpu.samples"
MARK = "550.90.07"


@pytest.fixture(scope="module")
def samples() -> list[dict[str, Any]]:
    fleet = Fleet(parse_scenario(SCENARIO))
    return [r.value for _, recs in fleet.timed_ticks() for r in recs if r.stream == "samples"]


def write_samples(path: Path, records: list[dict[str, Any]], per_block: int = 10,
                  bad_utf8: frozenset[int] = frozenset()) -> None:  # fmt: skip
    """A null-codec sample file, ``per_block`` records a block; the records numbered in
    ``bad_utf8`` get byte ``ff`` in their driver version."""
    schema = strip_logical_types(raw_schema("NodeGpuSample"))
    encode = body_encoder("NodeGpuSample")
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as fh:
        w = ContainerWriter(fh, schema, encode, "null", b"S" * 16, block_bytes=1 << 30)
        for i, rec in enumerate(records):
            body = encode(rec)
            if i in bad_utf8:
                assert body.count(MARK.encode()) == 1
                body = body.replace(MARK.encode(), b"550\xff90.07")
            w.write_body(body)
            if (i + 1) % per_block == 0:
                w.flush()
        w.flush()


def keys(records: Any) -> list[tuple[str, int]]:
    return [(r["node"], r["ts_ms"]) for r in records]


def test_header_with_a_negative_key_length_is_refused_not_looped(
    tmp_path: Path, samples: list[dict[str, Any]]
) -> None:
    # The input: byte 5 (length of the first metadata key, 0x16) set to 0x01 (-1),
    # tail cut. It looped forever in _header (pos += -1).
    good = tmp_path / "good.avro"
    write_samples(good, samples)
    data = good.read_bytes()
    assert data[5] == 0x16
    bad = tmp_path / SAMPLES / "2026-01-01T00.avro"
    bad.parent.mkdir()
    bad.write_bytes(data[:5] + b"\x01" + data[6:300])
    with pytest.raises(ValueError, match="corrupt Avro header"):
        block_spans(bad.read_bytes())
    with pytest.raises(ValueError, match="corrupt Avro header"):
        raw_blocks(bad)
    with bad.open("a+b") as fh, pytest.raises(ValueError, match="corrupt Avro header"):
        ContainerWriter(fh, {}, None)  # the archiver continuing a .part
    stats = ReadStats()
    assert list(read_file(bad, current_schema("NodeGpuSample"), stats=stats)) == []
    assert stats.bad_files == 1
    # Replay skips the file and counts it, on both paths.
    stats = ReadStats()
    assert list(archive_records(tmp_path, SPAN, stats=stats)) == []
    assert stats.bad_files == 1
    stats = ReadStats()
    assert list(file_tables([bad], decoded_here(sample_decoder()), {}, stats)) == []
    assert stats.bad_files == 1


@pytest.mark.parametrize("size", [2**62, 2**70, 2**25])
def test_header_size_beyond_any_header_is_refused_without_reading_it(
    tmp_path: Path, size: int
) -> None:
    path = tmp_path / "f.avro"
    path.write_bytes(b"Obj\x01" + encode_long(1) + encode_long(size) + b"x" * 100)
    with pytest.raises(ValueError, match="corrupt Avro header"):
        raw_blocks(path)
    # A header merely longer than the first read is read on (it is not corrupt).
    meta = b"x" * 200_000
    head = b"Obj\x01" + encode_long(1) + encode_long(11) + b"avro.schema" + encode_long(len(meta))
    path.write_bytes(head + meta + encode_long(0) + b"S" * 16)
    with pytest.raises(ValueError) as refused:
        raw_blocks(path)  # read whole, then refused as a schema: not as a corrupt header
    assert "Avro header" not in str(refused.value)


def _block_at(data: bytes, start: int) -> tuple[int, int]:
    """(position of the size varint, position after it) of the block at ``start``."""
    p = start
    while data[p] & 0x80:
        p += 1
    q = p + 1
    while data[q] & 0x80:
        q += 1
    return p + 1, q + 1


@pytest.mark.parametrize("size", [-1, -(2**40), 2**62, 2**63 + 5])
def test_corrupt_block_size_skips_that_block_and_counts_it(
    tmp_path: Path, samples: list[dict[str, Any]], size: int
) -> None:
    path = tmp_path / SAMPLES / "2026-01-01T00.avro"
    write_samples(path, samples[:40])  # 4 blocks of 10
    data = path.read_bytes()
    _, spans = block_spans(data)
    assert len(spans) == 4
    # Block 3's size varint replaced: -1 lands the old loop on an earlier sync marker.
    size_at, size_end = _block_at(data, spans[2][0])
    bad = data[:size_at] + encode_long(size) + data[size_end:]
    path.write_bytes(bad)
    kept = samples[:20] + samples[30:40]
    stats = ReadStats()
    assert len(block_spans(bad, stats)[1]) == 3
    assert stats.bad_blocks == 1
    stats = ReadStats()
    _, blocks = raw_blocks(path, stats)
    assert [c for c, _ in blocks] == [10, 10, 10]
    assert stats.bad_blocks == 1 and stats.cut_tails == 0
    for workers in (1, 2):
        stats = ReadStats()
        got = [v for _, _, v in archive_records(tmp_path, SPAN, workers=workers, stats=stats)]
        assert sorted(keys(got)) == sorted(keys(kept)), workers
        assert stats.bad_blocks == 1, workers
    parts = split_file(path, 1)
    assert len(parts) == 3


def test_corrupt_block_payload_is_skipped_to_the_next_sync_marker(
    tmp_path: Path, samples: list[dict[str, Any]]
) -> None:
    path = tmp_path / "f.avro"
    with path.open("wb") as fh:
        w = ContainerWriter(fh, strip_logical_types(raw_schema("NodeGpuSample")),
                            body_encoder("NodeGpuSample"), "zstandard", b"Z" * 16)  # fmt: skip
        for i, rec in enumerate(samples[:30]):
            w.write(rec)
            if (i + 1) % 10 == 0:
                w.flush()
    data = bytearray(path.read_bytes())
    _, spans = block_spans(bytes(data))
    _, payload = _block_at(bytes(data), spans[1][0])
    assert data[payload : payload + 4] == b"\x28\xb5\x2f\xfd"
    data[payload : payload + 4] = b"\x00" * 4  # the zstd frame of block 2 broken
    path.write_bytes(bytes(data))
    stats = ReadStats()
    _, blocks = raw_blocks(path, stats)
    assert [c for c, _ in blocks] == [10, 10]
    assert stats.bad_blocks == 1
    stats = ReadStats()
    got = list(read_file(path, current_schema("NodeGpuSample"), stats=stats))
    assert keys(got) == keys(samples[:10] + samples[20:30])
    assert stats.bad_blocks == 1


def test_cut_tail_is_counted_and_the_blocks_before_kept(
    tmp_path: Path, samples: list[dict[str, Any]]
) -> None:
    path = tmp_path / "f.avro"
    write_samples(path, samples[:20])
    path.write_bytes(path.read_bytes()[:-30])
    stats = ReadStats()
    got = list(read_file(path, current_schema("NodeGpuSample"), stats=stats))
    assert keys(got) == keys(samples[:10])
    assert stats.cut_tails == 1 and stats.bad_blocks == 0


def test_invalid_utf8_in_one_sample_skips_that_sample_on_both_paths(
    tmp_path: Path, samples: list[dict[str, Any]]
) -> None:
    # Issue item 3: byte ff in driver_version. The decoded path dropped the rest of the file as
    # a "truncated tail"; now both paths skip that one record, count it, keep every other.
    path = tmp_path / SAMPLES / "2026-01-01T00.avro"
    bad = frozenset({3, 17})
    write_samples(path, samples[:40], bad_utf8=bad)
    kept = [r for i, r in enumerate(samples[:40]) if i not in bad]
    stats = ReadStats()
    decoded = list(read_file(path, current_schema("NodeGpuSample"), stats=stats))
    assert keys(decoded) == keys(kept)
    assert stats.bad_records == 2
    # With the node filter (the C skip refuses invalid UTF-8 too).
    stats = ReadStats()
    nodes = frozenset({samples[3]["node"]})
    scoped = list(read_file(path, current_schema("NodeGpuSample"), nodes, stats))
    assert keys(scoped) == keys([r for r in kept if r["node"] in nodes])
    assert stats.bad_records == 2  # the other node's bad record too (as the column path counts)
    # The column path: the same records, the same count.
    strings: dict[str, int] = {}
    stats = ReadStats()
    n = sum(t[""].n for t in file_tables([path], decoded_here(sample_decoder()), strings, stats))
    assert n == len(kept) and stats.bad_records == 2
    stats = ReadStats()
    runs = list(column_archive_records(tmp_path, SPAN, strings, stats=stats))
    assert sum(v[""].n for _, _, v in runs) == len(kept)
    assert stats.bad_records == 2
    stats = ReadStats()
    assert len(list(archive_records(tmp_path, SPAN, stats=stats))) == len(kept)
    assert stats.bad_records == 2


def test_replay_summary_counts_what_was_skipped(
    tmp_path: Path, samples: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    from peerwatch.cli import main

    root = tmp_path / "archive"
    write_archive(Fleet(parse_scenario(SCENARIO)), root)
    path = root / SAMPLES / "2026-01-01T00.avro"
    write_samples(path, samples, bad_utf8=frozenset({5}))
    args = ["replay", "--archive", str(root), "--from", str(T0), "--to", str(T0 + 3_600_000),
            "--no-progress"]  # fmt: skip
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["bad_records"] == 1 and summary["path"] == "columns"
    assert summary["node_records"] == len(samples) - 1
    assert main([*args, "--workers", "2"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["bad_records"] == 1 and summary["path"] == "decoded"
    assert summary["node_records"] == len(samples) - 1


def test_lax_skipper_steps_over_what_the_decoder_reads(samples: list[dict[str, Any]]) -> None:
    schema = strip_logical_types(raw_schema("NodeGpuSample"))
    encode = body_encoder("NodeGpuSample")
    skip = lax_skipper(schema)
    for rec in samples[:5]:
        body = encode(rec)
        assert skip(body, 0) == len(body)
        assert fastavro.schemaless_reader(__import__("io").BytesIO(body), schema, None) == rec
        with pytest.raises((ValueError, IndexError)):
            skip(body[: len(body) // 2], 0)


def test_archiver_refuses_to_continue_a_part_file_with_a_corrupt_header(
    tmp_path: Path, samples: list[dict[str, Any]]
) -> None:
    from peerwatch.exporters.archive import ArchiveError, ArchiveWriter

    writer = ArchiveWriter(tmp_path, {SAMPLES: "NodeGpuSample"})
    writer.recover()
    writer.write(SAMPLES, 0, 0, samples[0], samples[0]["ts_ms"])
    writer.close()
    part = tmp_path / SAMPLES / "2026-01-01T00.avro.part"
    data = part.read_bytes()
    part.write_bytes(data[:5] + b"\x01" + data[6:])
    again = ArchiveWriter(tmp_path, {SAMPLES: "NodeGpuSample"})
    again.recover()
    with pytest.raises(ArchiveError, match=r"2026-01-01T00\.avro\.part cannot be continued"):
        again.write(SAMPLES, 0, 1, samples[1], samples[1]["ts_ms"])


@pytest.mark.parametrize("count", [-3, 2**62, 2**63, 2**64 + 1])
def test_corrupt_block_count_skips_that_block_on_both_paths(
    tmp_path: Path, samples: list[dict[str, Any]], count: int
) -> None:
    # Issue 12 item 2's other half: a count >= 2**63 overflowed the C reader's add_block.
    path = tmp_path / SAMPLES / "2026-01-01T00.avro"
    write_samples(path, samples[:30])
    data = path.read_bytes()
    _, spans = block_spans(data)
    start = spans[1][0]
    size_at, _ = _block_at(data, start)
    path.write_bytes(data[:start] + encode_long(count) + data[size_at:])
    stats = ReadStats()
    n = sum(t[""].n for t in file_tables([path], decoded_here(sample_decoder()), {}, stats))
    assert n == 20 and stats.bad_blocks == 1
    stats = ReadStats()
    got = list(read_file(path, current_schema("NodeGpuSample"), stats=stats))
    assert keys(got) == keys(samples[:10] + samples[20:30]) and stats.bad_blocks == 1


def test_a_count_too_small_keeps_what_it_says_and_counts_the_block(
    tmp_path: Path, samples: list[dict[str, Any]]
) -> None:
    path = tmp_path / SAMPLES / "2026-01-01T00.avro"
    write_samples(path, samples[:30])
    data = path.read_bytes()
    start = block_spans(data)[1][1][0]
    size_at, _ = _block_at(data, start)
    path.write_bytes(data[:start] + encode_long(4) + data[size_at:])  # 4 of its 10
    kept = samples[:14] + samples[20:30]
    stats = ReadStats()
    got = list(read_file(path, current_schema("NodeGpuSample"), stats=stats))
    assert keys(got) == keys(kept) and stats.bad_blocks == 1 and stats.bad_records == 0
    stats = ReadStats()
    n = sum(t[""].n for t in file_tables([path], decoded_here(sample_decoder()), {}, stats))
    assert n == len(kept) and stats.bad_blocks == 1
