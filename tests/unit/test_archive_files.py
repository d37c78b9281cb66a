"""Archive file helpers: names, hour ranges, container layout and splitting, cut tails."""

from __future__ import annotations

import io
from pathlib import Path

import fastavro
import pytest

from peerwatch.io.archive.layout import (
    HOUR_MS,
    archive_files,
    hour_start_ms,
    parse_file_name,
    record_time_ms,
)
from peerwatch.io.archive.reader import block_spans, raw_blocks, read_file, split_file
from peerwatch.io.archive.writer import ContainerWriter
from peerwatch.schemas.compiled import encode_long

SCHEMA = fastavro.parse_schema(
    {"type": "record", "name": "R", "fields": [{"name": "ts_ms", "type": "long"}]}
)
T0 = hour_start_ms("2026-01-01T00")


def write(path: Path, n: int, block: int = 10) -> None:
    with path.open("wb") as fh:
        w = fastavro.write.Writer(fh, SCHEMA, codec="deflate")
        for i in range(n):
            w.write({"ts_ms": i})
            if (i + 1) % block == 0:
                w.flush()
        w.flush()


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("2026-01-01T00.avro", ("2026-01-01T00", 0, False)),
        ("2026-01-01T23.2.avro", ("2026-01-01T23", 2, False)),
        ("2026-01-01T05.avro.part", ("2026-01-01T05", 0, True)),
        ("labels.jsonl", None),
        ("2026-01-01T05.avro.part.tmp", None),
    ],
)
def test_parse_file_name(name: str, parsed: tuple[str, int, bool] | None) -> None:
    assert parse_file_name(name) == parsed


def test_hour_start_ms() -> None:
    assert T0 == 1_767_225_600_000
    assert hour_start_ms("2026-01-01T01") - T0 == HOUR_MS


def test_record_time_prefers_ts_then_window_start() -> None:
    assert record_time_ms({"ts_ms": 5, "window_start_ms": 1}) == 5
    assert record_time_ms({"window_start_ms": 7}) == 7
    assert record_time_ms({"node": "x"}) is None


def test_archive_files_selects_overlapping_hours_in_order(tmp_path: Path) -> None:
    folder = tmp_path / "t"
    folder.mkdir()
    for name in ("2026-01-01T02.avro", "2026-01-01T00.avro", "2026-01-01T00.1.avro",
                 "2026-01-01T01.avro.part", "notes.txt"):  # fmt: skip
        (folder / name).touch()
    names = [p.name for p in archive_files(tmp_path, "t")]
    assert names == ["2026-01-01T00.avro", "2026-01-01T00.1.avro", "2026-01-01T01.avro.part",
                     "2026-01-01T02.avro"]  # fmt: skip
    picked = archive_files(tmp_path, "t", T0 + HOUR_MS + 1, T0 + 2 * HOUR_MS)
    assert [p.name for p in picked] == ["2026-01-01T01.avro.part"]
    assert archive_files(tmp_path, "missing") == []


def test_block_spans_and_split_cover_every_record_once(tmp_path: Path) -> None:
    path = tmp_path / "f.avro"
    write(path, 95, block=10)
    header_end, spans = block_spans(path.read_bytes())
    assert len(spans) == 10 and spans[0][0] == header_end
    parts = split_file(path, 1)  # one block per part
    assert len(parts) == 10
    got = [r["ts_ms"] for p in parts for r in fastavro.reader(io.BytesIO(p))]
    assert got == list(range(95))
    assert len(split_file(path, 1 << 30)) == 1


def test_cut_tail_is_ignored_by_readers(tmp_path: Path) -> None:
    path = tmp_path / "f.avro"
    write(path, 30, block=10)
    data = path.read_bytes()
    _, spans = block_spans(data)
    path.write_bytes(data[: spans[-1][1] - 5])  # the last block loses its sync marker's tail
    assert [r["ts_ms"] for r in read_file(path)] == list(range(20))
    assert len(block_spans(path.read_bytes())[1]) == 2
    got = [r["ts_ms"] for p in split_file(path, 1) for r in fastavro.reader(io.BytesIO(p))]
    assert got == list(range(20))


def test_not_a_container(tmp_path: Path) -> None:
    path = tmp_path / "f.avro"
    path.write_bytes(b"nope")
    assert list(read_file(path)) == []
    with pytest.raises(ValueError):
        split_file(path, 10)


@pytest.mark.parametrize("codec", ["zstandard", "deflate", "null"])
def test_raw_blocks_match_the_decoding_reader_at_every_cut(tmp_path: Path, codec: str) -> None:
    path = tmp_path / "f.avro"
    with path.open("wb") as fh:
        w = fastavro.write.Writer(fh, SCHEMA, codec=codec)
        for i in range(95):
            w.write({"ts_ms": i})
            if (i + 1) % 10 == 0:
                w.flush()
        w.flush()
    data = path.read_bytes()
    header_end, spans = block_spans(data)
    cuts = sorted({len(data), header_end, *(e for _, e in spans), *(e - 7 for _, e in spans),
                   *(s + 1 for s, _ in spans)})  # fmt: skip
    for cut in cuts:
        part = tmp_path / f"cut{cut}.avro"
        part.write_bytes(data[:cut])
        schema, blocks = raw_blocks(part)
        got = [fastavro.schemaless_reader(io.BytesIO(b[i:]), SCHEMA, None)
               for count, b in blocks for i in _offsets(b, count)]  # fmt: skip
        assert schema["name"] == "R"
        assert got == list(read_file(part)), cut


@pytest.mark.parametrize("size", [2**62, 2**63 - 1, -5, 10**9])
def test_raw_blocks_end_at_a_block_size_no_file_could_hold(tmp_path: Path, size: int) -> None:
    # A corrupted size varint: no read of that size, no error; the blocks before it are kept.
    path = tmp_path / "f.avro"
    with path.open("wb") as fh:
        w = fastavro.write.Writer(fh, SCHEMA, codec="null")
        for i in range(20):
            w.write({"ts_ms": i})
            if (i + 1) % 10 == 0:
                w.flush()
    data = path.read_bytes()
    _, spans = block_spans(data)
    second = spans[1][0]
    count = 10
    rest = data[second:]
    assert rest.startswith(encode_long(count))
    end = len(encode_long(count))  # the second block's size varint starts here
    while rest[end] & 0x80:
        end += 1
    bad = tmp_path / "bad.avro"
    bad.write_bytes(data[:second] + encode_long(count) + encode_long(size) + rest[end + 1 :])
    _, blocks = raw_blocks(bad)
    assert [count for count, _ in blocks] == [10]


def _offsets(block: bytes, count: int) -> list[int]:
    """Start of each 1-field long record in a block (a varint each)."""
    out, pos = [], 0
    for _ in range(count):
        out.append(pos)
        while block[pos] & 0x80:
            pos += 1
        pos += 1
    return out


def test_raw_blocks_refuse_what_they_cannot_read(tmp_path: Path) -> None:
    bad = tmp_path / "bad.avro"
    bad.write_bytes(b"not avro at all")
    with pytest.raises(ValueError, match="not an Avro"):
        raw_blocks(bad)
    other = tmp_path / "bz.avro"
    with other.open("wb") as fh:
        fastavro.writer(fh, SCHEMA, [{"ts_ms": 1}], codec="bzip2")
    with pytest.raises(ValueError, match="codec 'bzip2'"):
        raw_blocks(other)


def _long_body(record: dict[str, int]) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, SCHEMA, record)
    return buf.getvalue()


@pytest.mark.parametrize("codec", ["zstandard", "deflate", "null"])
def test_container_writer_files_are_read_by_fastavro_and_continued(
    tmp_path: Path, codec: str
) -> None:
    path = tmp_path / "w.avro"
    with path.open("wb") as fh:
        w = ContainerWriter(fh, SCHEMA, _long_body, codec, b"S" * 16, block_bytes=20)
        for i in range(25):
            w.write({"ts_ms": i})
        w.write_body(_long_body({"ts_ms": 1000}))  # an already-encoded record, copied
        w.flush()
    with path.open("a+b") as fh:  # a recovered file: its own header's codec and marker
        w = ContainerWriter(fh, SCHEMA, _long_body, "null")
        assert w.sync == b"S" * 16
        w.write({"ts_ms": 2000})
        w.flush()
    with path.open("rb") as fh:
        reader = fastavro.reader(fh)
        assert reader.metadata["avro.codec"] == codec
        assert [r["ts_ms"] for r in reader] == [*range(25), 1000, 2000]  # type: ignore[index]
    _, spans = block_spans(path.read_bytes())
    assert len(spans) == 3  # a block per 20 bytes of bodies, one at each flush


def test_container_writer_is_deterministic_and_refuses_unknown_codecs(tmp_path: Path) -> None:
    outs = []
    for name in ("a", "b"):
        with (tmp_path / name).open("wb") as fh:
            w = ContainerWriter(fh, SCHEMA, _long_body, "zstandard", b"M" * 16)
            for i in range(10):
                w.write({"ts_ms": i})
            w.flush()
        outs.append((tmp_path / name).read_bytes())
    assert outs[0] == outs[1]
    with (tmp_path / "c").open("wb") as fh, pytest.raises(ValueError, match="codec"):
        ContainerWriter(fh, SCHEMA, _long_body, "bzip2")


def test_zstandard_blocks_read_the_same_by_either_library(monkeypatch: pytest.MonkeyPatch) -> None:
    """A block of one frame that states its size is read by python-zstandard into one buffer;
    several frames, no stated size, a size over the bound and damage go to the backport, which
    reads or refuses them as before."""
    import zstandard

    from peerwatch.io.archive import reader

    backport = reader._zstd()
    inflate = reader._inflater("zstandard")
    data = b"GPU readings " * 500
    one = backport.compress(data)
    assert zstandard.frame_content_size(one) == len(data)
    assert inflate(one) == data
    two_frames = one + backport.compress(b"and more")
    assert inflate(two_frames) == data + b"and more"  # python-zstandard alone drops the second
    unsized = zstandard.ZstdCompressor(write_content_size=False).compress(data)
    assert zstandard.frame_content_size(unsized) == -1 and inflate(unsized) == data
    monkeypatch.setattr(reader, "ZSTD_ONE_BUFFER_MAX_BYTES", len(data) - 1)
    used: list[int] = []
    real = zstandard.ZstdDecompressor
    monkeypatch.setattr(zstandard, "ZstdDecompressor", lambda: used.append(1) or real())
    assert inflate(one) == data and not used  # over the bound: the backport's growing buffer
    for damaged in (one[:-5], b"\x28\xb5\x2f\xfd" + b"\xff" * 20, b"not zstd at all"):
        with pytest.raises(Exception):  # noqa: B017 - the reader counts any as a bad block
            inflate(damaged)
