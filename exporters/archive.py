"""The durable side of ``peerwatch archive``: Avro container files per topic and hour that a
killed archiver never leaves unreadable, and that a restarted one continues with no gap and no
duplicate.

Design (append + committed lengths):

* Each (topic, hour) being written is ``<root>/<topic>/<YYYY-MM-DD>T<HH>.avro.part``, an Avro
  object container (schema embedded, logical types stripped, zstandard-compressed). Records
  are appended as blocks; a block is only ever written whole by fastavro, but a kill can cut the
  last one short, so readers (:func:`~peerwatch.io.archive.reader.read_file`) stop at a cut
  tail: everything before it is intact and checked by its sync marker.
* :meth:`ArchiveWriter.commit` writes every open file's pending block, ``fsync``s the files and
  their folders, then replaces the state file ``<root>/_archive_state.json`` atomically (write a
  temp file, fsync, rename, fsync the folder). The state holds, in ONE atomic write, the next
  Kafka offset of every partition and the committed byte length of every ``.part`` file. Only
  after that may the caller commit the offsets to Kafka (the state file is the authority; the
  Kafka commit serves lag monitoring and a lost state file).
* :meth:`ArchiveWriter.recover` (at start) truncates each ``.part`` file to its committed length
  and deletes ``.part`` files the state does not know (created after the last commit): what is
  left is exactly the records before the stored offsets, which is where consumption resumes.
  Hence exactly once: no record is both on disk and re-consumed, none is skipped.
* Rotation: a ``.part`` is renamed to ``<hour>.avro`` once the topic's newest event time is
  ``rotate_after_s`` past the hour's end (records arriving later for that hour go into a new
  ``.part`` that becomes ``<hour>.<k>.avro``). Rotation happens inside a commit: state with the
  file at full length, rename, state without it; a crash in between leaves a complete file.
* Retention: :meth:`ArchiveWriter.retain` deletes closed files whose hour ended more than the
  retention before ``now``.

One archiver per directory: two processes appending to the same files would corrupt them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from peerwatch.errors import PeerwatchError
from peerwatch.files import fsync_dir, remove_stale_tmp, write_atomic
from peerwatch.io.archive.layout import (
    HOUR_MS,
    hour_of,
    hour_start_ms,
    parse_file_name,
    topic_entries,
)
from peerwatch.io.archive.writer import DEFAULT_CODEC, ContainerWriter, body_encoder
from peerwatch.schemas.registry import raw_schema, strip_logical_types

log = logging.getLogger(__name__)

STATE_FILE = "_archive_state.json"
CODECS = ("zstandard", "deflate", "null")
Offsets = dict[tuple[str, int], int]


class ArchiveError(PeerwatchError):
    """The archive directory is not in a state the archiver can continue from."""


@dataclass(frozen=True)
class ArchiveSettings:
    """``rotate_after_s``: how long past an hour's end (in the topic's event time) its file is
    closed. ``retention_days``: closed files older than this are deleted (0 keeps everything).
    ``flush_interval_s`` / ``flush_records``: a commit happens when either is reached."""

    codec: str = DEFAULT_CODEC
    flush_interval_s: float = 5.0
    flush_records: int = 20_000
    rotate_after_s: float = 600.0
    retention_days: float = 0.0

    def validate(self) -> ArchiveSettings:
        """Return self; raises ConfigError (from peerwatch.errors) naming a bad field."""
        from peerwatch.errors import ConfigError

        if self.codec not in CODECS:
            raise ConfigError("archive.codec", f"{self.codec!r} is not one of {', '.join(CODECS)}")
        for name in ("flush_interval_s", "rotate_after_s", "retention_days"):
            if getattr(self, name) < 0:
                raise ConfigError(f"archive.{name}", "must be >= 0")
        if self.flush_records < 1:
            raise ConfigError("archive.flush_records", "must be >= 1")
        return self


@dataclass
class _Open:
    fh: IO[bytes]
    writer: ContainerWriter
    path: Path
    topic: str
    hour: str
    pending: int = 0


def encode_state(offsets: Offsets, lengths: Mapping[str, int]) -> bytes:
    """The state file's bytes: offsets as ``{topic: {partition: next offset}}``, lengths of the
    open files by path relative to the root."""
    by_topic: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        by_topic.setdefault(topic, {})[str(partition)] = offset
    doc = {"version": 1, "offsets": by_topic, "open": dict(sorted(lengths.items()))}
    return json.dumps(doc, indent=1).encode()


def decode_state(data: bytes) -> tuple[Offsets, dict[str, int]]:
    """Inverse of :func:`encode_state`. Raises ArchiveError for a malformed state file."""
    try:
        doc = json.loads(data)
        offsets = {
            (topic, int(p)): int(o)
            for topic, parts in doc["offsets"].items()
            for p, o in parts.items()
        }
        lengths = {str(k): int(v) for k, v in doc["open"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ArchiveError(f"archive state file is malformed: {exc}") from exc
    return offsets, lengths


def expired(name: str, now_ms: int, retention_ms: int) -> bool:
    """True for a CLOSED archive file (not ``.part``) whose hour ended before now - retention;
    False for other names, misnamed ones included (``2026-13-45T99.avro``)."""
    parsed = parse_file_name(name)
    if parsed is None or parsed[2]:
        return False
    try:
        start_ms = hour_start_ms(parsed[0])
    except ValueError:
        return False
    return start_ms + HOUR_MS <= now_ms - retention_ms


def closed_name(folder: Path, hour: str) -> Path:
    """Where a rotated ``.part`` of ``hour`` goes: ``<hour>.avro``, else the first free
    ``<hour>.<k>.avro`` (late records for an hour that was already closed)."""
    candidate = folder / f"{hour}.avro"
    k = 0
    while candidate.exists():
        k += 1
        candidate = folder / f"{hour}.{k}.avro"
    return candidate


class ArchiveWriter:
    """Appends decoded records to the ``.part`` file of their topic and event hour; see the
    module docstring for the commit, recovery and rotation protocol.

    ``topic_schemas``: topic name -> schema name of its values.
    """

    def __init__(
        self,
        root: Path,
        topic_schemas: Mapping[str, str],
        settings: ArchiveSettings | None = None,
    ) -> None:
        self.root = Path(root)
        self.settings = (settings or ArchiveSettings()).validate()
        self._schemas = {t: strip_logical_types(raw_schema(s)) for t, s in topic_schemas.items()}
        self._encoders = {t: body_encoder(s) for t, s in topic_schemas.items()}
        self._open: dict[tuple[str, str], _Open] = {}
        self._dirty_dirs: set[Path] = set()
        self._newest_ms: dict[str, int] = {}
        self.offsets: Offsets = {}
        self._lengths: dict[str, int] = {}
        self.uncommitted = 0
        self.records = 0
        self.commits = 0

    @property
    def state_path(self) -> Path:
        return self.root / STATE_FILE

    # -- recovery ---------------------------------------------------------------------------------
    def recover(self) -> Offsets:
        """Bring the directory back to the last commit; returns the offsets to resume from
        (empty for a new directory). Raises ArchiveError when a committed file is shorter than
        its committed length (the disk lost fsynced data: continuing would hide a gap)."""
        self.root.mkdir(parents=True, exist_ok=True)
        offsets: Offsets = {}
        lengths: dict[str, int] = {}
        if self.state_path.exists():
            offsets, lengths = decode_state(self.state_path.read_bytes())
        remove_stale_tmp(self.state_path)
        kept: dict[str, int] = {}
        for folder in sorted(p for p in self.root.iterdir() if p.is_dir()):
            for entry in topic_entries(folder):  # a misnamed entry is skipped, never removed
                if not entry.partial:
                    continue
                path = entry.path
                rel = f"{folder.name}/{path.name}"
                committed = lengths.get(rel)
                size = path.stat().st_size
                if committed is None:
                    log.info("archive recovery: %s holds no committed record, removed", rel)
                    path.unlink()
                    continue
                if size < committed:
                    raise ArchiveError(f"{rel}: {size} bytes on disk, {committed} committed")
                if size > committed:
                    log.info("archive recovery: %s cut to %d bytes (was %d)", rel, committed, size)
                    with path.open("r+b") as fh:
                        fh.truncate(committed)
                        os.fsync(fh.fileno())
                kept[rel] = committed
        self.offsets = dict(offsets)
        self._lengths = kept
        self._write_state()
        return dict(offsets)

    # -- writing ----------------------------------------------------------------------------------
    def write(self, topic: str, partition: int, offset: int, record: Mapping[str, Any] | None,
              ts_ms: int, body: bytes | bytearray | memoryview | None = None) -> None:  # fmt: skip
        """Append ``record`` (event time ``ts_ms``) and note Kafka position ``offset`` as done.

        ``body``: the record's Avro body when the message was written with the current schema
        (copied as it is; else ``record`` is encoded). ``record`` None only advances the offset
        (a record the caller dead-lettered). Raises KeyError for a topic without a schema; the
        codec's EncodeError for a record that does not fit.
        """
        if record is not None:
            entry = self._writer(topic, hour_of(ts_ms))
            if body is not None:
                entry.writer.write_body(body)
            else:
                entry.writer.write(record)
            entry.pending += 1
            self.records += 1
            self._newest_ms[topic] = max(self._newest_ms.get(topic, ts_ms), ts_ms)
        self.offsets[(topic, partition)] = offset + 1
        self.uncommitted += 1

    def _writer(self, topic: str, hour: str) -> _Open:
        key = (topic, hour)
        entry = self._open.get(key)
        if entry is not None:
            return entry
        folder = self.root / topic
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{hour}.avro.part"
        fh: IO[bytes]
        schema, encode = self._schemas[topic], self._encoders[topic]
        if path.exists():  # recovered: continue the same container (its header is read back)
            fh = path.open("a+b")
            try:
                writer = ContainerWriter(fh, schema, encode)
            except ValueError as exc:  # a corrupt header: appending would hide it
                fh.close()
                raise ArchiveError(f"{self._rel(path)} cannot be continued: {exc}") from exc
        else:
            fh = path.open("wb")
            marker = hashlib.sha256(f"{topic}|{hour}".encode()).digest()[:16]
            writer = ContainerWriter(fh, schema, encode, self.settings.codec, marker)
            self._dirty_dirs.add(folder)
        entry = self._open[key] = _Open(fh, writer, path, topic, hour)
        return entry

    def due(self, since_commit_s: float) -> bool:
        """Whether a commit is due after ``since_commit_s`` seconds since the last one."""
        if not self.uncommitted:
            return False
        return (
            self.uncommitted >= self.settings.flush_records
            or since_commit_s >= self.settings.flush_interval_s
        )

    def commit(self) -> Offsets:
        """Make everything written durable, then rotate finished hours; returns the offsets that
        may now be committed to Kafka. Raises OSError when the disk refuses (nothing is then
        committed: the caller must stop, and the next start recovers)."""
        for entry in self._open.values():
            if entry.pending:
                entry.writer.flush()
                entry.pending = 0
            entry.fh.flush()
            os.fsync(entry.fh.fileno())
            self._lengths[self._rel(entry.path)] = os.fstat(entry.fh.fileno()).st_size
        for folder in sorted(self._dirty_dirs):
            fsync_dir(folder)
        self._dirty_dirs.clear()
        self._write_state()
        self._rotate()
        self.uncommitted = 0
        self.commits += 1
        return dict(self.offsets)

    def _rotate(self) -> None:
        after_ms = int(self.settings.rotate_after_s * 1000)
        done = [
            key
            for key in self._open
            if hour_start_ms(key[1]) + HOUR_MS + after_ms <= self._newest_ms.get(key[0], 0)
        ]
        if not done:
            return
        for key in sorted(done):
            entry = self._open.pop(key)
            entry.fh.close()
            target = closed_name(entry.path.parent, entry.hour)
            os.replace(entry.path, target)
            self._lengths.pop(self._rel(entry.path), None)
            fsync_dir(entry.path.parent)
            log.info("archive: closed %s", self._rel(target))
        self._write_state()

    def _rel(self, path: Path) -> str:
        return f"{path.parent.name}/{path.name}"

    def _write_state(self) -> None:
        write_atomic(self.state_path, encode_state(self.offsets, self._lengths))

    def retain(self, now_ms: int) -> list[Path]:
        """Delete closed files (not ``.part``) whose hour ended before now - retention (none
        when it is 0); returns them. Misnamed entries are skipped with a warning (see
        :func:`~peerwatch.io.archive.layout.topic_entries`), never deleted."""
        if self.settings.retention_days <= 0:
            return []
        retention_ms = int(self.settings.retention_days * 86_400_000)
        removed = []
        for folder in sorted(p for p in self.root.iterdir() if p.is_dir()):
            for entry in topic_entries(folder):
                if expired(entry.path.name, now_ms, retention_ms):
                    entry.path.unlink()
                    removed.append(entry.path)
        return removed

    def close(self) -> Offsets:
        """Commit and close every file (``.part`` files stay and are continued on restart)."""
        offsets = self.commit()
        for entry in self._open.values():
            entry.fh.close()
        self._open.clear()
        return offsets
