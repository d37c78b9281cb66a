"""The read-ahead process (streams/offline/read_ahead.py) gives what raw_blocks gives (and,
decoding, what the decoder gives here), in the same order, with the same warnings, counts and
refusals, on good and on hostile archive files;
a read-ahead process that ends early or a file left half read is an error, never a wait."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from peerwatch.io.archive.layout import ReadStats
from peerwatch.io.archive.reader import block_spans, raw_blocks
from peerwatch.producers.sim.fleet import Fleet
from peerwatch.producers.sim.scenario import parse_scenario
from peerwatch.schemas.compiled import encode_long
from peerwatch.streams.offline.read_ahead import SLOT_BYTES, ReadAhead, ReadAheadError
from peerwatch.streams.offline.replay import column_archive_records
from peerwatch.streams.offline.sample_runs import (
    SAMPLE_RUN,
    DecodedBlock,
    decoded_here,
    sample_decoder,
)
from tests.unit.test_archive_hostile import SAMPLES, SCENARIO, SPAN, _block_at, write_samples


@pytest.fixture(scope="module")
def samples() -> list[dict[str, Any]]:
    fleet = Fleet(parse_scenario(SCENARIO))
    return [r.value for _, recs in fleet.timed_ticks() for r in recs if r.stream == "samples"]


def blocks_here(path: Path) -> tuple[Any, list[tuple[int, bytes]], ReadStats]:
    stats = ReadStats()
    schema, blocks = raw_blocks(path, stats)
    return schema, [(c, bytes(d)) for c, d in blocks], stats


def blocks_ahead(ahead: ReadAhead, path: Path) -> tuple[Any, list[tuple[int, bytes]], ReadStats]:
    stats = ReadStats()
    schema, blocks = ahead.raw_blocks(path, stats)
    return schema, [(c, bytes(d)) for c, d in blocks], stats


def corrupt(path: Path) -> None:
    """Block 2's size varint made negative (that block is stepped over) and the last block cut
    (a cut tail)."""
    data = path.read_bytes()
    _, spans = block_spans(data)
    size_at, size_end = _block_at(data, spans[1][0])
    data = data[:size_at] + encode_long(-1) + data[size_end:]
    path.write_bytes(data[:-40])


@pytest.mark.parametrize(("slots", "slot_bytes"), [(8, 2 << 20), (1, 2 << 20), (2, 4096)])
def test_the_same_blocks_as_raw_blocks(
    tmp_path: Path, samples: list[dict[str, Any]], slots: int, slot_bytes: int
) -> None:
    # (2, 4096): every block is larger than a slot and comes through the pipe
    path = tmp_path / "s.avro"
    write_samples(path, samples[:75], per_block=10)
    want = blocks_here(path)
    assert len(want[1]) == 8
    with ReadAhead(slots, slot_bytes) as ahead:
        for _ in range(2):  # a file read twice, by the same process
            got = blocks_ahead(ahead, path)
            assert got[0] == want[0]
            assert got[1] == want[1]
            assert got[2].as_dict() == want[2].as_dict()


def test_a_corrupt_file_gives_the_same_blocks_warnings_and_counts(
    tmp_path: Path, samples: list[dict[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "s.avro"
    write_samples(path, samples[:60], per_block=10)
    corrupt(path)
    with caplog.at_level(logging.WARNING):
        want = blocks_here(path)
    warned_here = [(r.name, r.levelno, r.getMessage()) for r in caplog.records]
    assert want[2].bad_blocks == 1 and want[2].cut_tails == 1
    assert len(warned_here) == 2
    caplog.clear()
    with ReadAhead() as ahead, caplog.at_level(logging.WARNING):
        got = blocks_ahead(ahead, path)
    assert got[1] == want[1] and got[2].as_dict() == want[2].as_dict()
    # logged here, by the same logger, with the same words
    assert [(r.name, r.levelno, r.getMessage()) for r in caplog.records] == warned_here


def test_an_unreadable_header_or_a_missing_file_is_the_same_refusal(
    tmp_path: Path, samples: list[dict[str, Any]]
) -> None:
    bad = tmp_path / "bad.avro"
    bad.write_bytes(b"Obj\x01" + encode_long(1) + encode_long(2**62) + b"x" * 100)
    with pytest.raises(ValueError) as here:
        raw_blocks(bad)
    with ReadAhead() as ahead:
        with pytest.raises(ValueError) as there:
            ahead.raw_blocks(bad)
        assert str(there.value) == str(here.value)
        with pytest.raises(FileNotFoundError):
            raw_blocks(tmp_path / "missing.avro")
        with pytest.raises(FileNotFoundError):  # the same refusal, and the process goes on
            ahead.raw_blocks(tmp_path / "missing.avro")
        good = tmp_path / "good.avro"
        write_samples(good, samples[:20], per_block=10)
        assert blocks_ahead(ahead, good)[1] == blocks_here(good)[1]


def test_a_block_view_is_released_once_the_next_is_asked_for(
    tmp_path: Path, samples: list[dict[str, Any]]
) -> None:
    path = tmp_path / "s.avro"
    write_samples(path, samples[:30], per_block=10)
    with ReadAhead(slots=2) as ahead:
        _, blocks = ahead.raw_blocks(path)
        _, first = next(blocks)
        first_bytes = bytes(first)
        _, second = next(blocks)
        with pytest.raises(ValueError):
            bytes(first)  # never the bytes of a later block in the reused slot
        assert bytes(second) != first_bytes
        assert len(list(blocks)) == 1


def one_block_read(
    tmp_path: Path, samples: list[dict[str, Any]]
) -> tuple[ReadAhead, Iterator[tuple[int, Any]], Path, tuple[int, Any]]:
    """A read-ahead process of one slot, a 50-record file's blocks begun: its first block taken."""
    path = tmp_path / "s.avro"
    write_samples(path, samples[:50], per_block=10)
    ahead = ReadAhead(slots=1)
    _, blocks = ahead.raw_blocks(path)
    return ahead, blocks, path, next(blocks)


def test_a_file_left_half_read_stops_the_process_and_later_calls_raise(
    tmp_path: Path, samples: list[dict[str, Any]]
) -> None:
    ahead, blocks, path, _ = one_block_read(tmp_path, samples)
    try:
        blocks.close()  # e.g. an error while decoding
        with pytest.raises(ReadAheadError, match="left unread"):
            ahead.raw_blocks(path)
    finally:
        ahead.close()


def test_closing_while_a_block_is_held_stops_the_process_and_raises_nothing(
    tmp_path: Path, samples: list[dict[str, Any]]
) -> None:
    # e.g. decoding the block raised, and the iterator is still referenced
    ahead, blocks, path, (count, view) = one_block_read(tmp_path, samples)
    assert count == 10 and len(view) > 0
    ahead.close()
    assert not ahead._proc.is_alive()
    with pytest.raises(ReadAheadError):
        ahead.raw_blocks(path)
    blocks.close()


def test_an_iterator_of_a_file_superseded_by_the_next_refuses_to_start(
    tmp_path: Path, samples: list[dict[str, Any]]
) -> None:
    one, two = tmp_path / "1.avro", tmp_path / "2.avro"
    write_samples(one, samples[:20], per_block=10)
    write_samples(two, samples[20:50], per_block=10)
    with ReadAhead() as ahead:
        _, unread = ahead.raw_blocks(one)  # not iterated (e.g. another schema version)
        assert blocks_ahead(ahead, two)[1] == blocks_here(two)[1]
        with pytest.raises(ReadAheadError, match="after another was opened"):
            next(unread)


def test_a_killed_process_is_an_error_not_a_wait(
    tmp_path: Path, samples: list[dict[str, Any]]
) -> None:
    ahead, blocks, path, _ = one_block_read(tmp_path, samples)
    try:
        pid = ahead._proc.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        ahead._proc.join(timeout=10)
        with pytest.raises(ReadAheadError, match="ended early"):
            list(blocks)
        with pytest.raises(ReadAheadError):
            ahead.raw_blocks(path)
    finally:
        ahead.close()


def test_column_replay_input_is_the_same_read_ahead(
    tmp_path: Path, samples: list[dict[str, Any]]
) -> None:
    path = tmp_path / SAMPLES / "2026-01-01T00.avro"
    write_samples(path, samples, per_block=7)
    corrupt(path)

    def runs(**kw: Any) -> tuple[list[Any], dict[str, int]]:
        stats = ReadStats()
        strings: dict[str, int] = {}
        out = []
        for stream, _key, value in column_archive_records(
            tmp_path, SPAN, strings, stats=stats, **kw
        ):
            assert stream == SAMPLE_RUN
            top = value[""]
            out.append((top.n, top.values["ts_ms"].tolist(), top.values["node"].tolist()))
        return out, stats.as_dict()

    want = runs()
    assert want[1]["bad_blocks"] == 1 and want[1]["cut_tails"] == 1
    assert sum(n for n, _, _ in want[0]) > 0
    with ReadAhead(slots=2) as ahead:
        assert runs(tables_of=decoded_here(sample_decoder(), ahead.raw_blocks)) == want
    for slot_bytes in (SLOT_BYTES, 4096):  # 4096: every block's tables through the pipe
        with ReadAhead(slots=2, slot_bytes=slot_bytes, decoder=sample_decoder()) as ahead:
            assert runs(tables_of=ahead.decoded_blocks) == want


def readable(block: DecodedBlock, strings: dict[str, int]) -> Any:
    """A decoded block with every column as a list and string codes as the strings."""
    names = list(strings)
    spec = {t.path: t for t in sample_decoder().spec.tables()}
    out = {}
    for path, table in block.tables.items():
        cols = {}
        for col in spec[path].columns:
            values = table.values[col.name].tolist()
            cols[col.name] = [names[v] for v in values] if col.kind == "str" else values
            assert not table.values[col.name].flags.writeable
            assert table.values[col.name].flags.aligned  # the compiled loops take it as it is
        valid = {k: v.tolist() for k, v in table.valid.items()}
        parent = None if table.parent is None else table.parent.tolist()
        out[path] = (table.n, cols, valid, parent)
    return block.records, block.size, out, block.bad, block.end


@pytest.mark.parametrize("slot_bytes", [SLOT_BYTES, 4096])
def test_decoded_blocks_are_those_decoded_here_in_any_strings(
    tmp_path: Path, samples: list[dict[str, Any]], slot_bytes: int
) -> None:
    """The same tables, refusals and counts as a decoder here, over a hostile file (a corrupt
    block size, a cut tail, two samples with invalid UTF-8) and a good one after it; string codes those of the caller's dict, also when it held other strings
    before (the read-ahead process decodes with a copy of it) and when another dict is given
    later."""
    bad, good = tmp_path / "bad.avro", tmp_path / "good.avro"
    write_samples(bad, samples[:60], per_block=7, bad_utf8=frozenset({3, 20}))
    corrupt(bad)
    write_samples(good, samples[60:90], per_block=10)

    def read(tables_of: Any, strings: dict[str, int]) -> list[Any]:
        out = []
        for path in (bad, good):
            stats = ReadStats()
            _, blocks = tables_of(path, stats, strings)
            out.append(([readable(b, strings) for b in blocks], stats.as_dict()))
        return out

    want = read(decoded_here(sample_decoder()), {})
    assert want[0][1]["bad_blocks"] == 1 and want[0][1]["cut_tails"] == 1
    utf8 = [reason for block in want[0][0] for _, reason in block[3] if "UTF-8" in reason]
    assert len(utf8) == 2  # each sample with invalid UTF-8 skipped, the rest of its block kept
    with ReadAhead(slots=2, slot_bytes=slot_bytes, decoder=sample_decoder()) as ahead:
        assert read(ahead.decoded_blocks, {}) == want
        other = {"gpu-elsewhere": 0, "GPU-elsewhere": 1}
        assert read(ahead.decoded_blocks, other) == want  # strings held before: codes after them
        assert list(other)[:2] == ["gpu-elsewhere", "GPU-elsewhere"]
        assert read(ahead.decoded_blocks, {}) == want


def test_a_strings_dict_changed_under_a_files_blocks_is_an_error(
    tmp_path: Path, samples: list[dict[str, Any]]
) -> None:
    """Only decoders add to a strings dict: a string added by another hand between two blocks
    would take a code the read-ahead process gives to another string, so it stops there."""
    path = tmp_path / "s.avro"
    write_samples(path, samples[:30], per_block=10)
    strings: dict[str, int] = {}
    with ReadAhead(slots=2, decoder=sample_decoder()) as ahead:
        _, blocks = ahead.decoded_blocks(path, None, strings)
        next(blocks)
        strings["added-elsewhere"] = len(strings)
        with pytest.raises(ReadAheadError, match="strings dict changed"):
            next(blocks)


def test_decoded_blocks_need_a_decoder(tmp_path: Path, samples: list[dict[str, Any]]) -> None:
    path = tmp_path / "s.avro"
    write_samples(path, samples[:10], per_block=10)
    with ReadAhead() as ahead, pytest.raises(ValueError, match="without a decoder"):
        ahead.decoded_blocks(path, None, {})
