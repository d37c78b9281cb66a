"""A bounded, crash-tolerant on-disk FIFO of records that could not be delivered to Kafka.

Records are appended to segment files (``<dir>/<n:012d>.seg``) as frames::

    u32 length | u32 crc32(payload) | payload

where the payload holds the topic, key, value, headers, event time and send sequence. The read
position lives in ``<dir>/head`` (segment, offset), replaced atomically after each pop. A torn frame
at the tail (a crash mid-write) fails its length or CRC check and is cut off when the spool opens.

Limits: ``max_bytes`` and ``max_age_s``. When a limit forces dropping, whole oldest segments go
first; every dropped record is counted in ``dropped`` and logged.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

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
        head = self.directory / "head"
        if head.exists():
            seg_text, off_text = head.read_text().split()
            self._head_segment, self._head_offset = int(seg_text), int(off_text)
        paths = sorted(self.directory.glob("*.seg"))
        if not (self.directory / f"{self._head_segment:012d}.seg").exists():
            # The head segment is gone (a crash inside prepend or pop): read what is left, from 0.
            self._head_segment, self._head_offset = (int(paths[0].stem) if paths else 0), 0
        for path in paths:
            number = int(path.stem)
            if number < self._head_segment:
                path.unlink()  # fully consumed before a crash removed it
                continue
            seg = _Segment(number, path, 0, path.stat().st_mtime)
            start = self._head_offset if number == self._head_segment else 0
            good_end, count = self._scan(path, start)
            if good_end < path.stat().st_size:
                log.warning("spool: cutting a torn frame at the tail of %s", path.name)
                with path.open("r+b") as fh:
                    fh.truncate(good_end)
            seg.size, seg.records = good_end, count
            self._segments.append(seg)
            self._count += count
        if self._segments and self._segments[0].number != self._head_segment:
            self._head_segment, self._head_offset = self._segments[0].number, 0

    @staticmethod
    def _scan(path: Path, start: int) -> tuple[int, int]:
        data = path.read_bytes()
        pos, count = start, 0
        while pos + _FRAME.size <= len(data):
            length, crc = _FRAME.unpack_from(data, pos)
            end = pos + _FRAME.size + length
            if end > len(data) or zlib.crc32(data[pos + _FRAME.size : end]) != crc:
                break
            pos, count = end, count + 1
        return pos, count

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
                seg = _Segment(number, self.directory / f"{number:012d}.seg", 0, time.time())
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
        return self._scan(seg.path, self._head_offset)[1]

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
        path = self.directory / f"{number:012d}.seg"
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
        text = f"{self._head_segment} {self._head_offset}\n"
        tmp = self.directory / "head.tmp"
        try:
            tmp.write_text(text)
        except OSError as exc:
            if exc.errno not in _DISK_FULL:
                raise
            # A full disk has no block for a new file: overwrite the head in place (it fits in
            # the block it has; the spaces pad out a longer old text).
            tmp.unlink(missing_ok=True)
            head = self.directory / "head"
            with head.open("r+" if head.exists() else "w") as fh:
                old = fh.read()
                fh.seek(0)
                fh.write(text.rstrip("\n").ljust(len(old) - 1) + "\n")
            return
        os.replace(tmp, self.directory / "head")
