"""A bounded, crash-tolerant on-disk FIFO of records that could not be delivered to Kafka.

Records are appended to segment files (``<dir>/<n:012d>.seg``) as frames::

    u32 length | u32 crc32(payload) | payload

where the payload holds the topic, key, value, headers, event time and send sequence. The read
position lives in ``<dir>/head`` (segment, offset), replaced atomically after each pop. A torn frame
at the tail (a crash mid-write) fails its length or CRC check and is cut off when the spool opens.

Limits: ``max_bytes`` and ``max_age_s``. When a limit forces dropping, whole oldest segments go
first; every dropped record is counted in ``dropped`` and logged.

Every file here is hostile input when the spool opens. Nothing is deleted on the word of the
``head`` file alone: segments go only as records are popped or dropped (counted), and the head
moves after the unlink. So a segment older than the head at open means a damaged head or a
prepend cut short, and the spool is read from its oldest segment (records may come twice, none
is lost). A segment path that is not a readable file (a folder, no permission) is set aside as
``<name>.bad`` and counted in ``bad_segments``; delivery goes on with the others.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from peerwatch.files import write_atomic

log = logging.getLogger(__name__)

_FRAME = struct.Struct("<II")
_FIXED = struct.Struct(
    "<qqHiiH"
)  # seq, ts_ms, topic_len, key_len (-1 = None), value_len, n_headers
_HDR = struct.Struct("<HI")
# Segments are numbered from here so that prepend() can always use a lower number.
_FIRST_SEGMENT = 10**9
#: errno values that mean "the spool's filesystem is full": handled as a limit, never raised.
_DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
#: One encoded frame (named apart: inside Spool, ``bytes`` is a property).
_FrameBytes = bytes


@dataclass(frozen=True)
class SpooledRecord:
    """One record waiting for Kafka. ``seq`` is the send order within the producing process."""

    topic: str
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()
    ts_ms: int = 0
    seq: int = 0

    def encode(self) -> bytes:
        topic = self.topic.encode()
        parts = [
            _FIXED.pack(
                self.seq, self.ts_ms, len(topic),
                -1 if self.key is None else len(self.key), len(self.value), len(self.headers),
            ),
            topic, self.key or b"", self.value,
        ]  # fmt: skip
        for name, val in self.headers:
            raw = name.encode()
            parts += [_HDR.pack(len(raw), len(val)), raw, val]
        return b"".join(parts)

    @classmethod
    def decode(cls, payload: bytes) -> SpooledRecord:
        """Inverse of :meth:`encode`. Raises ValueError (struct.error, UnicodeDecodeError) for
        bytes that are not one whole record."""
        seq, ts_ms, tlen, klen, vlen, nh = _FIXED.unpack_from(payload, 0)
        pos = _FIXED.size
        topic = payload[pos : pos + tlen].decode()
        pos += tlen
        key = None if klen < 0 else payload[pos : pos + klen]
        pos += max(klen, 0)
        value = payload[pos : pos + vlen]
        pos += vlen
        headers = []
        for _ in range(nh):
            nlen, hlen = _HDR.unpack_from(payload, pos)
            pos += _HDR.size
            name = payload[pos : pos + nlen].decode()
            pos += nlen
            headers.append((name, payload[pos : pos + hlen]))
            pos += hlen
        if pos != len(payload):
            raise ValueError(f"a record of {len(payload)} bytes says {pos}")
        return cls(topic, key, value, tuple(headers), ts_ms, seq)


@dataclass
class _Segment:
    number: int
    path: Path
    size: int
    mtime_s: float
    records: int = 0


def _segment_size_for(directory: Path, wanted: int) -> int:
    """``wanted``, or less on a small filesystem: a full disk can only be made room on by
    removing whole segments, so a segment is at most 1/16 of the filesystem (at least 64 KiB)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return wanted
    return min(wanted, max(64 * 1024, st.f_blocks * st.f_frsize // 16))


@dataclass
class Spool:
    """The on-disk FIFO. Not thread-safe: one owner thread (the delivery worker)."""

    directory: Path
    max_bytes: int = 256 * 1024 * 1024
    max_age_s: float = 24 * 3600.0
    segment_bytes: int = 4 * 1024 * 1024
    dropped: int = 0
    #: Found when opening: an unreadable or untrusted ``head`` file (off a frame boundary, or
    #: with segments older than the one it names), corrupt regions skipped inside segments
    #: (and their bytes: records lost there), torn frames cut at a segment's tail.
    bad_head: int = 0
    #: Segment paths set aside as ``<name>.bad`` (a folder, an unreadable file): their records,
    #: if any, are not delivered.
    bad_segments: int = 0
    corrupt_regions: int = 0
    corrupt_bytes: int = 0
    torn_tails: int = 0
    _segments: list[_Segment] = field(default_factory=list)
    _head_segment: int = 0
    _head_offset: int = 0
    _count: int = 0

    def __post_init__(self) -> None:
        self.directory = Path(self.directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = _segment_size_for(self.directory, self.segment_bytes)
        self._load()

    # -- state ----------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._count

    @property
    def bytes(self) -> int:
        return sum(s.size for s in self._segments) - self._head_offset_if_any()

    def _head_offset_if_any(self) -> int:
        return self._head_offset if self._segments else 0

    def _load(self) -> None:
        paths = sorted(p for p in self.directory.glob("*.seg") if p.stem.isdigit())
        paths = [p for p in paths if p.is_file() or not self._set_aside(p, "not a file")]
        self._head_segment, self._head_offset = self._read_head(paths)
        numbers = [int(p.stem) for p in paths]
        if self._head_segment not in numbers:
            # The head segment is gone (a crash inside prepend or pop): read what is left, from 0.
            self._head_segment, self._head_offset = (numbers[0] if numbers else 0), 0
        elif numbers[0] < self._head_segment:
            # Segments are unlinked before the head moves past them: one still here means the
            # head is damaged (or a prepend was cut short). Deleting on its word lost every
            # record before it; read from the oldest instead.
            log.warning("spool: %d segment(s) older than the head %s; reading from the oldest",
                        numbers.index(self._head_segment), self._head_segment)  # fmt: skip
            self.bad_head += 1
            self._head_segment, self._head_offset = numbers[0], 0
        for path in paths:
            try:
                self._load_segment(path)
            except OSError as exc:  # unreadable (no permission, an I/O error): not fatal
                self._set_aside(path, str(exc))
        if self._segments and self._segments[0].number != self._head_segment:
            self._head_segment, self._head_offset = self._segments[0].number, 0
        self._write_head()

    def _load_segment(self, path: Path) -> None:
        """Check one segment (from the head when it is the head's) and keep it. Raises OSError
        when it cannot be read."""
        number = int(path.stem)
        seg = _Segment(number, path, 0, path.stat().st_mtime)
        start = self._head_offset if number == self._head_segment else 0
        if start:
            # The head is always at a frame's end: elsewhere, it was damaged, and a damaged
            # number says nothing of where delivery stopped. Read the whole segment again
            # (records may come twice; none is lost).
            data = path.read_bytes()
            bounds = {a for a, _ in _frames(data, 0)[0]} | {len(data)}
            if start not in bounds:
                log.warning("spool: head offset %d is no frame boundary of %s; reading "
                            "the segment from its start", start, path.name)  # fmt: skip
                self.bad_head += 1
                start = 0
                self._head_offset = start
        seg.size, seg.records, rewritten = self._recover(path, start)
        if rewritten and number == self._head_segment:
            self._head_offset = 0  # the segment now starts at the head
        self._segments.append(seg)
        self._count += seg.records

    def _set_aside(self, path: Path, why: str) -> bool:
        """Rename a segment path that cannot be read to ``<name>.bad`` (``.bad.<k>`` when taken),
        out of the spool's way, and count it; True once done. Raises OSError when even the
        rename fails (the folder is not writable: the spool cannot work at all)."""
        target = path.with_name(path.name + ".bad")
        for k in itertools.count(1):
            if not target.exists():
                break
            target = path.with_name(f"{path.name}.bad.{k}")
        os.replace(path, target)
        self.bad_segments += 1
        log.error("spool: %s set aside as %s (%s); its records, if any, are not delivered",
                  path.name, target.name, why)  # fmt: skip
        return True

    def _fresh(self, path: Path) -> Path:
        """``path`` for a new segment, with whatever non-file sits there set aside."""
        if path.exists() and not path.is_file():
            self._set_aside(path, "not a file")
        return path

    def _read_head(self, paths: list[Path]) -> tuple[int, int]:
        """(segment, offset) from the ``head`` file. An empty or garbage file (a power loss
        before the head was durable, a stray write) is counted in ``bad_head`` and the spool is
        read from the start of its oldest segment: records may be delivered twice, none lost."""
        head = self.directory / "head"
        try:
            seg_text, off_text = head.read_text().split()
            segment, offset = int(seg_text), int(off_text)
            if segment < 0 or offset < 0:
                raise ValueError("negative position")
            return segment, offset
        except FileNotFoundError:
            return 0, 0
        except (ValueError, UnicodeDecodeError) as exc:
            self.bad_head += 1
            first = int(paths[0].stem) if paths else 0
            log.warning("spool: head file unreadable (%s); reading from the oldest segment", exc)
            return first, 0

    def _recover(self, path: Path, start: int) -> tuple[int, int, bool]:
        """Check the frames of a segment from ``start``; returns (size, records, rewritten). A
        corrupt frame in the middle is stepped over to the next valid frame (length, CRC and
        record all check) and the segment rewritten with the valid frames from ``start`` only
        (so a head segment's head moves to 0). A torn tail (no valid frame after it) is cut.
        What is lost is counted."""
        data = path.read_bytes()
        frames, first_gap, lost_bytes = _frames(data, start)
        end = frames[-1][1] if frames else start
        if first_gap is None:
            return len(data), len(frames), False
        if end <= first_gap:  # nothing valid after the fault: a write cut short
            log.warning("spool: cutting a torn frame at the tail of %s", path.name)
            self.torn_tails += 1
            with path.open("r+b") as fh:
                fh.truncate(end)
                os.fsync(fh.fileno())
            return end, len(frames), False
        regions = sum(1 for (_, e), (s2, _) in itertools.pairwise(frames) if e != s2)
        regions += (frames[0][0] != start) + (end != len(data))
        self.corrupt_regions += regions
        self.corrupt_bytes += lost_bytes
        log.error("spool: %s: %d corrupt region(s) of %d bytes skipped; %d records kept",
                  path.name, regions, lost_bytes, len(frames))  # fmt: skip
        blob = b"".join(data[f0:f1] for f0, f1 in frames)
        write_atomic(path, blob)
        return len(blob), len(frames), True

    # -- writing --------------------------------------------------------------------------------
    def append(self, records: list[SpooledRecord]) -> None:
        """Append records durably (flushed to the OS; fsync per call). Enforces the limits.

        A full disk (ENOSPC, EDQUOT) is a limit too: records are written a segment's worth at a
        time; when one write finds the disk full, the partial write is cut off and the oldest
        segments are dropped (counted) until it fits; when nothing older is left, that part of
        the new records is dropped and counted. Other OS errors propagate."""
        if not records:
            return
        part: list[_FrameBytes] = []
        part_bytes = 0
        for rec in records:
            payload = rec.encode()
            frame = _FRAME.pack(len(payload), zlib.crc32(payload)) + payload
            if part and part_bytes + len(frame) > self.segment_bytes:
                self._append_frames(part)
                part, part_bytes = [], 0
            part.append(frame)
            part_bytes += len(frame)
        self._append_frames(part)
        self._enforce_limits()

    def _append_frames(self, frames: list[_FrameBytes]) -> None:
        blob = b"".join(frames)
        while True:
            seg = self._segments[-1] if self._segments else None
            fresh = seg is None or seg.size >= self.segment_bytes
            if fresh:
                number = (seg.number + 1) if seg else max(self._head_segment, _FIRST_SEGMENT)
                path = self._fresh(self.directory / f"{number:012d}.seg")
                seg = _Segment(number, path, 0, time.time())
                self._segments.append(seg)
            assert seg is not None
            try:
                if fresh and len(self._segments) == 1:
                    self._head_segment, self._head_offset = seg.number, 0
                    self._write_head()
                with seg.path.open("ab") as fh:
                    fh.write(blob)
                    fh.flush()
                    os.fsync(fh.fileno())
                break
            except OSError as exc:
                if exc.errno not in _DISK_FULL:
                    raise
                self._cut_back(seg)
            if self._count == 0:
                self.dropped += len(frames)
                log.error(
                    "spool: disk full in %s; dropped %d new records (nothing older to give up)",
                    self.directory, len(frames),
                )  # fmt: skip
                return
            log.error("spool: disk full in %s; dropping the oldest segment", self.directory)
            self._drop_head_segment()
        seg.size += len(blob)
        seg.records += len(frames)
        seg.mtime_s = time.time()
        self._count += len(frames)

    def _cut_back(self, seg: _Segment) -> None:
        """Undo a failed append to ``seg``: cut the file back to its known size; forget (and
        remove) a segment that holds nothing yet."""
        with contextlib.suppress(FileNotFoundError), seg.path.open("r+b") as fh:
            fh.truncate(seg.size)
        if seg.records == 0 and seg is self._segments[-1]:
            self._segments.pop()
            seg.path.unlink(missing_ok=True)

    def _enforce_limits(self) -> None:
        now = time.time()
        while len(self._segments) > 1 and (
            self.bytes > self.max_bytes or now - self._segments[0].mtime_s > self.max_age_s
        ):
            self._drop_head_segment()
        if self._segments and self.bytes > self.max_bytes:
            # A single oversized segment: drop it too rather than grow without bound.
            self._drop_head_segment()

    def _drop_head_segment(self) -> None:
        seg = self._segments.pop(0)
        lost = self._records_from_head(seg)
        self.dropped += lost
        self._count -= lost
        log.error("spool limit reached: dropped the %d oldest undelivered records", lost)
        seg.path.unlink(missing_ok=True)
        if self._segments:
            self._head_segment, self._head_offset = self._segments[0].number, 0
        else:
            self._head_segment, self._head_offset = seg.number + 1, 0
        self._write_head()

    def _records_from_head(self, seg: _Segment) -> int:
        if seg.number != self._head_segment or self._head_offset == 0:
            return seg.records
        return len(_frames(seg.path.read_bytes()[: seg.size], self._head_offset)[0])

    def prepend(self, records: list[SpooledRecord]) -> None:
        """Put records back in front of the head (a replay chunk that was only partly delivered).

        Writes one new segment holding ``records`` and the unread rest of the head segment, removes
        the old head segment, then moves the head: a crash at any point loses nothing.
        """
        if not records:
            return
        blob = b"".join(
            _FRAME.pack(len(p), zlib.crc32(p)) + p for p in (r.encode() for r in records)
        )
        old = self._segments[0] if self._segments else None
        rest_records = 0
        if old is not None and old.number == self._head_segment and self._head_offset:
            blob += old.path.read_bytes()[self._head_offset : old.size]
            rest_records = self._records_from_head(old)
            self._segments.pop(0)
        else:
            old = None
        number = (self._segments[0].number if self._segments else self._head_segment) - 1
        if old is not None:
            number = old.number - 1
        path = self._fresh(self.directory / f"{number:012d}.seg")
        with path.open("wb") as fh:
            fh.write(blob)
            fh.flush()
            os.fsync(fh.fileno())
        if old is not None:
            old.path.unlink(missing_ok=True)
        self._segments.insert(
            0, _Segment(number, path, len(blob), time.time(), len(records) + rest_records)
        )
        self._head_segment, self._head_offset = number, 0
        self._count += len(records)
        self._write_head()

    # -- reading --------------------------------------------------------------------------------
    def peek(self, limit: int) -> list[SpooledRecord]:
        """Up to ``limit`` records from the head, oldest first, without removing them."""
        out: list[SpooledRecord] = []
        for _, _, rec in self._iter_from_head():
            out.append(rec)
            if len(out) >= limit:
                break
        return out

    def pop(self, n: int) -> None:
        """Remove the ``n`` oldest records (after they were delivered)."""
        if n <= 0:
            return
        seen = 0
        position: tuple[int, int] | None = None
        for number, end, _ in self._iter_from_head():
            seen += 1
            position = (number, end)
            if seen == n:
                break
        if position is None:
            return
        number, end = position
        while self._segments and self._segments[0].number < number:
            self._segments.pop(0).path.unlink(missing_ok=True)
        self._head_segment, self._head_offset = number, end
        self._count -= seen
        head_seg = self._segments[0] if self._segments else None
        if head_seg is not None and end >= head_seg.size and len(self._segments) > 1:
            self._segments.pop(0).path.unlink(missing_ok=True)
            self._head_segment, self._head_offset = self._segments[0].number, 0
        elif head_seg is not None and end >= head_seg.size and self._count == 0:
            self._segments.pop(0).path.unlink(missing_ok=True)
            self._head_segment, self._head_offset = number + 1, 0
        self._write_head()

    def _iter_from_head(self) -> Iterator[tuple[int, int, SpooledRecord]]:
        for seg in list(self._segments):
            data = seg.path.read_bytes()
            pos = self._head_offset if seg.number == self._head_segment else 0
            while pos + _FRAME.size <= seg.size:
                length, _ = _FRAME.unpack_from(data, pos)
                start = pos + _FRAME.size
                pos = start + length
                yield seg.number, pos, SpooledRecord.decode(data[start:pos])

    def _write_head(self) -> None:
        """Replace ``head`` durably (fsync the file, rename, fsync the folder): a power loss
        leaves the old or the new position, never an empty file. A full disk has no block for a
        new file: then the head is overwritten in place (it fits in the block it has; spaces pad
        out a longer old text)."""
        text = f"{self._head_segment} {self._head_offset}\n"
        head = self.directory / "head"
        try:
            write_atomic(head, text.encode())
        except OSError as exc:
            if exc.errno not in _DISK_FULL:
                raise
            with head.open("r+" if head.exists() else "w") as fh:
                old = fh.read()
                fh.seek(0)
                fh.write(text.rstrip("\n").ljust(len(old) - 1) + "\n")
                fh.flush()
                os.fsync(fh.fileno())


def _frames(data: bytes, start: int) -> tuple[list[tuple[int, int]], int | None, int]:
    """The valid frames of ``data`` from ``start`` as (start, end), where the first fault is
    (None: none) and the bytes of the corrupt regions (stepped over to the next valid frame)."""
    frames: list[tuple[int, int]] = []
    first_gap: int | None = None
    lost = 0
    pos = start
    while pos < len(data):
        end = _frame_end(data, pos)
        if end is not None:
            frames.append((pos, end))
            pos = end
            continue
        if first_gap is None:
            first_gap = pos
        nxt = pos + 1
        while nxt < len(data) and _frame_end(data, nxt) is None:
            nxt += 1
        lost += nxt - pos
        pos = nxt
    return frames, first_gap, lost


def _frame_end(data: bytes, pos: int) -> int | None:
    """The end of a valid frame at ``pos`` (its length fits, its CRC matches and its payload
    decodes as a record), else None."""
    if pos + _FRAME.size > len(data):
        return None
    length, crc = _FRAME.unpack_from(data, pos)
    end: int = pos + _FRAME.size + length
    if end > len(data) or length < _FIXED.size:
        return None
    payload = data[pos + _FRAME.size : end]
    if zlib.crc32(payload) != crc:
        return None
    try:
        SpooledRecord.decode(payload)
    except (ValueError, struct.error, UnicodeDecodeError):
        return None
    return end
