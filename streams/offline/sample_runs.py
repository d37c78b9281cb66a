"""Replay's samples as columns: archive blocks (or Kafka messages) decoded into column tables
and released in replay order, as runs between the records of the other streams.

The replay order of samples is (event time, node name, read order), as
:func:`peerwatch.streams.offline.replay.sort_records` orders decoded records; a record of
another stream at time T comes before the samples of T. :class:`SampleRuns` holds the samples
read but not yet released; :meth:`SampleRuns.release` sorts those under a time and hands them
out as one table set. Reading an archive as a stream, samples are released once they are
``reorder_ms`` older than the newest read, so memory holds that span, not the hour; a sample
older than what was already released raises :class:`ArchiveUnordered`, which says how large a
window would have held it (replay again with that window).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from fastavro.schema import to_parsing_canonical_form

from peerwatch.io.archive.layout import ReadStats, record_time_ms
from peerwatch.io.archive.reader import raw_blocks
from peerwatch.schemas.columns import (
    ColumnDecoder,
    Table,
    concat_tables,
    select_rows,
    slice_rows,
    take_rows,
)
from peerwatch.schemas.compiled import Unsupported
from peerwatch.schemas.registry import raw_schema, strip_logical_types
from peerwatch.streams.core.windows import SAMPLE_SPEC
from peerwatch.streams.offline.read_ahead import read_ahead

log = logging.getLogger(__name__)

#: How an archive file's blocks are read: ``(path, stats) -> (writer schema, blocks)``, as
#: :func:`~peerwatch.io.archive.reader.raw_blocks` (a block: its record count and bytes).
BlocksOf = Callable[[Path, ReadStats | None], tuple[Any, Iterator[tuple[int, Any]]]]


class DecodedBlock(NamedTuple):
    """One archive block's samples as columns, as :meth:`ColumnDecoder.block` gives them (the
    tables, the records not read, the offset after the last one read), with the block's record
    count and size in bytes."""

    records: int
    size: int
    tables: dict[str, Table]
    bad: list[tuple[int, str]]
    end: int


#: How an archive file's sample blocks are read and decoded: ``(path, stats, strings) ->
#: (writer schema, blocks)``, string codes of ``strings``; the blocks are decoded only once
#: asked for (the caller checks the writer schema first): :func:`decoded_here` (a benchmark
#: passes blocks read beforehand).
TablesOf = Callable[[Path, ReadStats | None, dict[str, int]], tuple[Any, Iterator[DecodedBlock]]]


def decoded_here(decoder: ColumnDecoder, blocks_of: BlocksOf = raw_blocks) -> TablesOf:
    """Blocks read by ``blocks_of`` (in a thread, ahead: :func:`read_ahead`) and decoded by
    ``decoder`` in this thread."""

    def tables_of(
        path: Path, stats: ReadStats | None, strings: dict[str, int]
    ) -> tuple[Any, Iterator[DecodedBlock]]:
        # the reading thread counts what it skips apart (added once the file is read): the
        # caller's counts are this thread's to change
        skipped = None if stats is None else ReadStats()
        writer_schema, blocks = blocks_of(path, skipped)

        def decoded() -> Iterator[DecodedBlock]:
            try:
                for count, data in read_ahead(blocks):
                    yield DecodedBlock(count, len(data), *decoder.block(data, 0, count, strings))
            finally:
                if stats is not None and skipped is not None:
                    stats.add(skipped)

        return writer_schema, decoded()

    return tables_of


#: The stream of a record that is a run of sample columns (value: the tables).
SAMPLE_RUN = "sample-run"
DEFAULT_REORDER_MS = 30_000
FAR_FUTURE_MS = 1 << 62


def wider_window_ms(current_ms: int, needed_ms: int) -> int | None:
    """The reorder window to read again with after :class:`ArchiveUnordered`: twice what the
    late sample needed and at least twice ``current_ms`` (so a few tries reach any disorder);
    None (each hour whole) once that is an hour or more."""
    wider = max(2 * current_ms, 2 * needed_ms, 1_000)
    return None if wider >= 3_600_000 else wider


class ArchiveUnordered(Exception):
    """Samples of an archive out of order by more than the streaming read allows.
    ``needed_ms``: the reorder window that would have held the sample that came too late."""

    def __init__(self, message: str, needed_ms: int) -> None:
        super().__init__(message)
        self.needed_ms = needed_ms


@dataclass
class _Part:
    """One block's samples held: tables, read order numbers, lowest and highest time."""

    tables: dict[str, Table]
    seq: np.ndarray
    lo: int
    hi: int
    #: whether its samples are in time order (then a cut is a slice: views, no copy)
    ordered: bool = False


class SampleRuns:
    """Samples read and not yet released (see the module docstring). ``strings`` are the codes
    of the tables' strings: give the pipeline's aggregator's."""

    def __init__(self, strings: dict[str, int]) -> None:
        self.strings = strings
        self._parts: list[_Part] = []
        self._seq = 0
        self.released_below = -(1 << 62)
        self.newest: int | None = None
        self._rank = np.empty(0, np.int64)

    def add(self, tables: Mapping[str, Table]) -> None:
        """Samples of one block or batch, in read order. Raises ArchiveUnordered for one older
        than what was already released."""
        n = tables[""].n
        if not n:
            return
        ts = tables[""].values["ts_ms"]
        lo, hi = int(ts.min()), int(ts.max())
        if lo < self.released_below:
            newest = hi if self.newest is None else max(self.newest, hi)
            raise ArchiveUnordered(
                f"a sample at {lo} ms after samples up to {self.released_below} ms were released",
                needed_ms=newest - lo,
            )
        seq = np.arange(self._seq, self._seq + n, dtype=np.int64)
        ordered = n < 2 or bool(np.all(ts[1:] >= ts[:-1]))
        self._parts.append(_Part(dict(tables), seq, lo, hi, ordered))
        self._seq += n
        self.newest = hi if self.newest is None else max(self.newest, hi)

    def release(self, below_ms: int) -> list[dict[str, Table]]:
        """Every held sample before ``below_ms``, in replay order, as runs to take one after
        another (empty: none). Only the parts that straddle ``below_ms`` are cut; the rest go
        out or stay whole. Parts that follow one another in replay order (blocks written in
        that order: the usual case) go out as they are, views of the decoded blocks: joining
        them would copy every column once more (about a tenth of a replay)."""
        self.released_below = max(self.released_below, below_ms)
        out: list[_Part] = []
        kept: list[_Part] = []
        for part in self._parts:
            if part.hi < below_ms:
                out.append(part)
            elif part.lo >= below_ms:
                kept.append(part)
            elif part.ordered:  # a block written in time order (the usual case): two slices
                ts = part.tables[""].values["ts_ms"]
                cut, n = int(np.searchsorted(ts, below_ms, side="left")), len(ts)
                kept.append(_Part(slice_rows(part.tables, cut, n), part.seq[cut:], int(ts[cut]),
                                  part.hi, True))  # fmt: skip
                out.append(_Part(slice_rows(part.tables, 0, cut), part.seq[:cut], part.lo, 0))
            else:
                before = part.tables[""].values["ts_ms"] < below_ms
                after = ~before
                ts_after = part.tables[""].values["ts_ms"][after]
                kept.append(_Part(select_rows(part.tables, after), part.seq[after],
                                  int(ts_after.min()), part.hi))  # fmt: skip
                out.append(_Part(select_rows(part.tables, before), part.seq[before], part.lo, 0))
        self._parts = kept
        if not out:
            return []
        seq = np.concatenate([p.seq for p in out])
        ts = np.concatenate([p.tables[""].values["ts_ms"] for p in out])
        rank = self._name_rank()[np.concatenate([p.tables[""].values["node"] for p in out])]
        if len(ts) < 2 or _in_order(ts, rank, seq):
            return [p.tables for p in out]
        return [take_rows(concat_tables([p.tables for p in out]), np.lexsort((seq, rank, ts)))]

    def _name_rank(self) -> np.ndarray:
        """Per string code, its rank in name order (node names sort as strings)."""
        if len(self._rank) != len(self.strings):
            names = list(self.strings)
            order = sorted(range(len(names)), key=names.__getitem__)
            self._rank = np.empty(len(names), np.int64)
            self._rank[order] = np.arange(len(names))
        return self._rank


def _in_order(ts: np.ndarray, rank: np.ndarray, seq: np.ndarray) -> bool:
    """Whether rows already follow (time, node name, read order)."""
    dt, dr = ts[1:] - ts[:-1], rank[1:] - rank[:-1]
    return bool(np.all((dt > 0) | ((dt == 0) & ((dr > 0) | ((dr == 0) & (seq[1:] > seq[:-1]))))))


def in_scope(tables: Mapping[str, Table], from_ms: int, to_ms: int, strings: Mapping[str, int],
             keep_nodes: frozenset[str] | None) -> dict[str, Table]:  # fmt: skip
    """The samples of ``[from_ms, to_ms)`` (of ``keep_nodes`` only, when given)."""
    ts = tables[""].values["ts_ms"]
    keep = (ts >= from_ms) & (ts < to_ms)
    if keep_nodes is not None:
        codes = np.fromiter((strings[n] for n in keep_nodes if n in strings), np.int64)
        keep &= np.isin(tables[""].values["node"], codes)
    return dict(tables) if keep.all() else select_rows(tables, keep)


def merge(waiting: deque[tuple[str, str, Any]], runs: Sequence[Mapping[str, Table]],
          below_ms: int) -> Iterator[tuple[str, str, Any]]:  # fmt: skip
    """``runs`` (released samples, replay order, one run after another) cut into SAMPLE_RUN
    records around the records of other streams from ``waiting`` under ``below_ms``: a record
    at T comes before the samples of T."""
    for run in runs:
        n = run[""].n
        ts = run[""].values["ts_ms"]
        pos = 0
        while waiting and (at := record_time_ms(waiting[0][2]) or 0) < below_ms:
            cut = int(np.searchsorted(ts, at, side="left"))
            if cut == n:  # after this run's samples: in a later run, or after them all
                break
            if cut > pos:
                yield SAMPLE_RUN, "", slice_rows(run, pos, cut)
                pos = cut
            yield waiting.popleft()
        if pos < n:
            yield SAMPLE_RUN, "", slice_rows(run, pos, n) if pos else dict(run)
    while waiting and (record_time_ms(waiting[0][2]) or 0) < below_ms:
        yield waiting.popleft()


def sample_decoder() -> ColumnDecoder:
    """The C column decoder of the current NodeGpuSample. Raises Unsupported without it."""
    return ColumnDecoder(SAMPLE_SPEC, strip_logical_types(raw_schema("NodeGpuSample")))


def file_tables(paths: Sequence[Path], tables_of: TablesOf, strings: dict[str, int],
                stats: ReadStats | None = None) -> Iterator[dict[str, Table]]:  # fmt: skip
    """The samples of archive files block by block, as tables. A bad record is skipped with a
    warning (and the rest of its block when its bytes are cut); a file whose header is unreadable
    is skipped with a warning; each counted in ``stats`` (records not read, blocks, files), as
    the decoded path counts them. Raises Unsupported for a file of another schema version (read
    it through the decoded path). ``tables_of``: how a file's blocks are read and decoded
    (:func:`decoded_here`)."""
    current = to_parsing_canonical_form(strip_logical_types(raw_schema("NodeGpuSample")))
    for path in paths:
        try:
            writer_schema, blocks = tables_of(path, stats, strings)
        except ValueError as exc:
            if "codec" in str(exc):
                raise Unsupported(str(exc)) from exc
            log.warning("%s: unreadable header (%s), skipped", path, exc)
            if stats is not None:
                stats.bad_files += 1
            continue
        if to_parsing_canonical_form(strip_logical_types(writer_schema)) != current:
            raise Unsupported(f"{path}: written with another NodeGpuSample version")
        for count, size, tables, bad, end in blocks:
            for i, reason in bad:
                log.warning("%s: sample %d of a block skipped (%s)", path, i, reason)
            if stats is not None:
                stats.bad_records += count - tables[""].n
            if end < size and not bad:  # a count too small: records left unread
                log.warning("%s: %d trailing bytes in a block ignored", path, size - end)
                if stats is not None:
                    stats.bad_blocks += 1
            yield tables
