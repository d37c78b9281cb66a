"""Where the hot stage may commit on a samples partition, so that a crash loses no open window.

The hot stage keeps open windows in memory only. Instead of snapshotting them, it commits, per
samples partition, the offset of the first sample of its oldest *open* window: a restarted (or
newly assigned) worker re-reads from there and rebuilds every open window exactly. With the
offset goes metadata: ``closed_until_ms`` (every window ending at or before it was emitted) and
``seen_until`` (the next offset the committer would have read). A re-read sample below
``seen_until`` whose window ended by ``closed_until_ms`` was handled before the crash (emitted
in a closed window, or dead-lettered as late) and is skipped, neither re-aggregated nor
dead-lettered twice. Pure bookkeeping: no Kafka here (:mod:`peerwatch.streams.live.hot_stage` does
the I/O).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass
class PartitionProgress:
    """Offsets of one samples partition. ``window_ms`` is the window length."""

    window_ms: int
    #: Next offset to read (the last one read + 1); None before the first record.
    next_offset: int | None = None
    #: Window start -> offset of its first sample, for windows not closed yet.
    first_offset: dict[int, int] = field(default_factory=dict)
    closed_until_ms: int | None = None
    #: From the metadata of the commit this partition resumed from.
    resumed_closed_until_ms: int | None = None
    resumed_seen_until: int | None = None
    skipped: int = 0

    def resume(self, metadata: str | None) -> None:
        """Take ``closed_until_ms`` / ``seen_until`` from a committed offset's metadata (bad or
        missing metadata: resume as a fresh partition)."""
        try:
            data = json.loads(metadata) if metadata else {}
            closed, seen = data.get("closed_until_ms"), data.get("seen_until")
        except (ValueError, AttributeError):
            return
        if isinstance(closed, int) and isinstance(seen, int):
            self.resumed_closed_until_ms, self.resumed_seen_until = closed, seen

    def already_handled(self, offset: int, ts_ms: int) -> bool:
        """True for a re-read sample that the previous owner already emitted or dead-lettered
        (counted in ``skipped``)."""
        seen, closed = self.resumed_seen_until, self.resumed_closed_until_ms
        if seen is None or closed is None or offset >= seen:
            return False
        if ts_ms - ts_ms % self.window_ms + self.window_ms <= closed:
            self.skipped += 1
            return True
        return False

    def read(self, offset: int, ts_ms: int) -> None:
        """Note a sample that goes to the aggregator (late ones too: they are dead-lettered)."""
        self.next_offset = offset + 1
        start = ts_ms - ts_ms % self.window_ms
        if self.closed_until_ms is None or start + self.window_ms > self.closed_until_ms:
            self.first_offset.setdefault(start, offset)

    def skip(self, offset: int) -> None:
        """Note a record that holds no window (undecodable, already handled)."""
        self.next_offset = offset + 1

    def closed(self, closed_until_ms: int) -> None:
        """Windows ending at or before ``closed_until_ms`` were emitted."""
        self.closed_until_ms = closed_until_ms
        for start in [s for s in self.first_offset if s + self.window_ms <= closed_until_ms]:
            del self.first_offset[start]

    def commit_point(self) -> tuple[int, str] | None:
        """(offset, metadata) to commit now, or None before the first record."""
        if self.next_offset is None:
            return None
        offset = min(self.first_offset.values(), default=self.next_offset)
        closed = self.closed_until_ms
        if closed is None:
            closed = self.resumed_closed_until_ms
        # Re-reading after a resume starts below the old ``seen_until``, and cannot close a
        # window past the old ``closed_until_ms`` before reading beyond it: keep the larger.
        seen = max(self.next_offset, self.resumed_seen_until or 0)
        meta = {"closed_until_ms": closed, "seen_until": seen}
        if closed is None:
            meta = {}
        return offset, json.dumps(meta, separators=(",", ":"))
