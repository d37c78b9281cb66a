"""The archive's layout: Avro container files per topic and event hour, and how they are named.

``<root>/<topic>/<YYYY-MM-DD>T<HH>.avro``, the record's event hour in UTC. The archiver
(:mod:`peerwatch.exporters.archive`) also leaves ``<hour>.avro.part`` (the hour it is still
appending to) and ``<hour>.<k>.avro`` (records that arrived after their hour was closed); readers
read all three. An entry named like an archive file that cannot be one (an hour that does not
exist, or outside 1970..9999; a folder) is skipped with a warning naming it and counted
(:func:`topic_entries`), by the readers and by the archiver's recovery and retention alike.
Shared by ``peerwatch simulate --archive``, ``peerwatch archive``, ``peerwatch replay`` and
``peerwatch job --archive``; the container format itself is :mod:`.reader` and :mod:`.writer`.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

log = logging.getLogger(__name__)


HOUR_MS = 3_600_000

#: ``<YYYY-MM-DD>T<HH>`` then ``.avro``, ``.<k>.avro`` or ``.avro.part``; ASCII digits only
#: (``\d`` alone takes any Unicode digit: a year in fullwidth digits names no file of ours).
_FILE_RE = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2})(?:\.(\d+))?\.avro(\.part)?$", re.ASCII)


@dataclass
class ReadStats:
    """What readers of archive files skipped: records that did not decode (``bad_records``),
    corrupt blocks stepped over to the next sync marker (``bad_blocks``; their records are not
    known), files whose header is unreadable (``bad_files``), files cut inside a block
    (``cut_tails``: an archiver killed mid-write, or corruption with no sync marker after it)
    and entries of a topic folder named like an archive file that cannot be one (``misnamed``,
    see :func:`topic_entries`)."""

    bad_records: int = 0
    bad_blocks: int = 0
    bad_files: int = 0
    cut_tails: int = 0
    misnamed: int = 0

    def add(self, other: ReadStats) -> None:
        for name in _READ_STATS:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in _READ_STATS}


_READ_STATS = ("bad_records", "bad_blocks", "bad_files", "cut_tails", "misnamed")

#: Event times an archive file can be named by: 1970-01-01 up to the end of year 9999 (UTC).
MAX_TS_MS = 253_402_300_800_000


def hour_of(ts_ms: int) -> str:
    """``YYYY-MM-DDTHH`` of an event time (UTC). Raises ValueError for a time before 1970 or
    after year 9999 (no archive file is named by it)."""
    if not 0 <= ts_ms < MAX_TS_MS:
        raise ValueError(f"event time {ts_ms} ms is outside 1970..9999")
    return dt.datetime.fromtimestamp(ts_ms // 1000, tz=dt.UTC).strftime("%Y-%m-%dT%H")


def hour_start_ms(hour: str) -> int:
    """Epoch ms of the start of an ``YYYY-MM-DDTHH`` hour (UTC). Raises ValueError if malformed
    (``2026-13-45T99``, year 0) or outside 1970..9999 (no event time is archived there)."""
    parsed = dt.datetime.strptime(hour, "%Y-%m-%dT%H").replace(tzinfo=dt.UTC)
    start = int(parsed.timestamp()) * 1000
    if not 0 <= start < MAX_TS_MS:
        raise ValueError(f"hour {hour} is outside 1970..9999")
    return start


def parse_file_name(name: str) -> tuple[str, int, bool] | None:
    """``(hour, k, partial)`` of an archive file name, None for other files.

    ``k`` is 0 for the hour's main file and ``k`` for ``<hour>.<k>.avro``; ``partial`` is True for
    ``.avro.part`` (still being appended to).
    """
    m = _FILE_RE.fullmatch(name)  # not before a trailing newline, as $ alone allows
    if m is None:
        return None
    return m.group(1), int(m.group(2) or 0), m.group(3) is not None


def record_time_ms(record: Mapping[str, Any]) -> int | None:
    """The event time of a peerwatch record (``ts_ms``, else ``window_start_ms``), ms; None if
    it has neither."""
    for name in ("ts_ms", "window_start_ms"):
        value = record.get(name)
        if isinstance(value, int):
            return value
    return None


class ArchiveEntry(NamedTuple):
    """One archive file of a topic folder (see :func:`parse_file_name`)."""

    hour: str
    k: int
    partial: bool
    start_ms: int
    path: Path


def topic_entries(folder: Path, stats: ReadStats | None = None) -> list[ArchiveEntry]:
    """The archive files of one topic folder, by (hour, k); none when it is not a folder.

    Other names (labels, temporary files) are ignored. An entry named like an archive file
    that cannot be one (``2026-13-45T99.avro``, ``0000-01-01T00.avro``, a folder named
    ``<hour>.avro``) is hostile input, never a crash of the replay or the archiver: skipped
    with a warning naming it, counted in ``stats.misnamed``."""
    found: list[ArchiveEntry] = []
    try:
        paths = sorted(Path(folder).iterdir())
    except (NotADirectoryError, FileNotFoundError):
        return []
    for path in paths:
        parsed = parse_file_name(path.name)
        if parsed is None:
            continue
        try:
            start = hour_start_ms(parsed[0])
            if not path.is_file():
                raise ValueError("not a regular file")
        except ValueError as exc:
            log.warning("archive: %s skipped, misnamed (%s)", path, exc)
            if stats is not None:
                stats.misnamed += 1
            continue
        found.append(ArchiveEntry(*parsed, start, path))
    return sorted(found)


def archive_files(
    root: Path,
    topic: str,
    from_ms: int | None = None,
    to_ms: int | None = None,
    stats: ReadStats | None = None,
) -> list[Path]:
    """Files of ``topic`` under ``root`` whose hour overlaps ``[from_ms, to_ms)``, oldest hour
    first (each hour's files together). ``stats``: counts the misnamed entries skipped (see
    :func:`topic_entries`)."""
    return [
        e.path
        for e in topic_entries(Path(root) / topic, stats)
        if (from_ms is None or e.start_ms + HOUR_MS > from_ms)
        and (to_ms is None or e.start_ms < to_ms)
    ]
