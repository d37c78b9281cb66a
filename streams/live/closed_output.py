"""The hot stage's channel to stage 3: closed windows, censuses and heartbeats, per batch.

What a batch of samples closed leaves after the whole batch, on ``<id>-window-batches``: each
job's ``network`` messages of each window (its nodes' ports, before its windows, same key), one
message per job and window (every samples partition's windows of it; a big job's window in
several messages, whole sources each), keyed by job; then each source's fleet census of each
window start it closed, to the stage-3 partition whose fleet watch judges
(:data:`~peerwatch.streams.core.fleet.FLEET_CHANNEL`: it merges every source's, one decision,
and sends its verdicts to the other channels); then one watermark heartbeat to every stage-3 partition (the closed-until of
every assigned samples partition). Same producer, same partition: in that order.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from peerwatch.errors import CodecError
from peerwatch.streams.core.fleet import FLEET_CHANNEL
from peerwatch.streams.core.network_jobs import JobPorts, job_ports_messages
from peerwatch.streams.core.sample_stage import Census
from peerwatch.streams.core.windows import ClosedWindows
from peerwatch.streams.live.delivery import OutputDelivery
from peerwatch.streams.live.window_batches import WindowBatchCodec, job_parts

#: Without a batch's heartbeat, one that says something new goes to stage 3 within this (s).
HEARTBEAT_EVERY_S = 1.0
#: An idle heartbeat that would say what the last one said goes out again only this often (s):
#: each makes every stage-3 channel release over all its pending jobs for nothing, but a stage 3
#: that forgot its watermarks in a rebalance after the last heartbeat waits for this repeat.
HEARTBEAT_REPEAT_S = 10.0


class ClosedOutput:
    """One batch's closed windows, censuses and watermarks, sent by :meth:`send`."""

    def __init__(
        self,
        delivery: OutputDelivery,
        topic: str,
        job_partitions: int,
        monotonic_s: Callable[[], float] = time.monotonic,
    ) -> None:
        """``monotonic_s``: the clock of the heartbeats' intervals (s)."""
        self.delivery = delivery
        self.topic = topic
        self.job_partitions = job_partitions
        self.batch_codec = WindowBatchCodec()
        #: (job, window start, end) -> (samples partition -> the windows it closed in this
        #: batch, as columns; wall ms when the last of them closed it): one message each, after
        #: the batch.
        self._out: dict[tuple[str, int, int], tuple[dict[int, dict[str, Any]], float]] = {}
        #: (key, value) of the network messages of the windows closed in this batch: sent
        #: before the batch's window batches
        self._net_out: list[tuple[bytes, bytes]] = []
        #: Fleet censuses of the window starts closed in this batch.
        self._census: list[dict[str, Any]] = []
        #: Samples partition -> its new closed-until (ms), sent after the batch.
        self.marks: dict[int, int] = {}
        self.monotonic_s = monotonic_s
        self._heartbeat_due_s = 0.0  # monotonic s of the next heartbeat without closed windows
        self._repeat_due_s = 0.0  # ... of the next one that says what the last one said
        self._last_mark = b""  # the last heartbeat sent

    def add(
        self,
        src: int,
        closed: list[ClosedWindows],
        censuses: list[Census],
        ports: list[JobPorts],
        closed_wall_ms: float,
    ) -> None:
        """What source ``src`` closed in this batch (``ports``: each job's ports over those
        windows)."""
        self._net_out += [(jp.job_id.encode(), m) for jp in ports for m in job_ports_messages(jp)]
        for start, end, seen in censuses:
            self._census.append({"kind": "census", "src": src, "start": start, "end": end,
                                 "census": {n: c.to_json() for n, c in seen.items()}})  # fmt: skip
        for c in closed:  # sent after the whole batch, one message per job and window
            for job_id, part in sorted(job_parts(c).items()):
                key = (job_id, c.start_ms, c.end_ms)
                parts = self._out[key][0] if key in self._out else {}
                parts[src] = part  # the job's windows as columns (WindowColumnsPart)
                self._out[key] = (parts, closed_wall_ms)

    def send(self, closed_until: Mapping[int, int | None], idle: Callable[[int], dict[int, int]]
             ) -> None:  # fmt: skip
        """Send what the batch closed, then a heartbeat when a source's closed-until moved
        (see :meth:`heartbeat`)."""
        for key, value in self._net_out:  # a job's ports before its windows (same key)
            self.delivery.send(self.topic, key, value)
        self._net_out.clear()
        for (job_id, start, end), (parts, closed_wall_ms) in self._out.items():
            try:
                values = self.batch_codec.encode_batches(job_id, start, end, parts,
                                                         closed_wall_ms)  # fmt: skip
            except CodecError as exc:  # a value the aggregator should never make: seen, skipped
                self.delivery.unencodable(self.topic, job_id.encode(),
                                          f"window batch of job {job_id} at {start}", exc)  # fmt: skip
                continue
            for value in values:
                self.delivery.send(self.topic, job_id.encode(), value)
        self._out.clear()
        for census in self._census:  # to the channel whose fleet watch judges (one decision)
            value = json.dumps(census).encode()
            self.delivery.send(self.topic, b"~census", value, partition=FLEET_CHANNEL)
        self._census.clear()
        if self.marks:
            self.heartbeat(closed_until, idle)

    def heartbeat(
        self, closed_until: Mapping[int, int | None], idle: Callable[[int], dict[int, int]]
    ) -> None:
        """One JSON ``watermark`` heartbeat to every stage-3 partition (:meth:`_mark`)."""
        mark = self._mark(closed_until, idle)
        if mark is not None:
            self._send_mark(mark)

    def heartbeat_when_idle(
        self, closed_until: Mapping[int, int | None], idle: Callable[[int], dict[int, int]]
    ) -> None:
        """A heartbeat every :data:`HEARTBEAT_EVERY_S` without one, when it says something new:
        input that came in one batch, or a partition found empty after it, must not leave
        windows waiting for the next input. One that says what the last one said goes out
        every :data:`HEARTBEAT_REPEAT_S` only (a stage 3 that forgot its watermarks)."""
        now_s = self.monotonic_s()
        if now_s < self._heartbeat_due_s:
            return
        self._heartbeat_due_s = now_s + HEARTBEAT_EVERY_S
        mark = self._mark(closed_until, idle)
        if mark is not None and (mark != self._last_mark or now_s >= self._repeat_due_s):
            self._send_mark(mark)

    def _mark(
        self, closed_until: Mapping[int, int | None], idle: Callable[[int], dict[int, int]]
    ) -> bytes | None:
        """The heartbeat message: the closed-until of every assigned partition
        (``closed_until``), not only those that moved (the fleet watches wait for all of them: a
        restarted stage 3 knows none, and a partition at the end of its input closes nothing
        more), and ``idle(latest)``'s, for those that hold no node. None before any partition
        closed a window. Empties :attr:`marks`."""
        for p, until in closed_until.items():
            if until is not None:
                self.marks.setdefault(p, until)
        if not self.marks:
            return None
        self.marks.update(idle(max(self.marks.values())))
        marks = {str(p): until for p, until in sorted(self.marks.items())}
        self.marks.clear()
        return json.dumps({"kind": "watermark", "marks": marks}).encode()

    def _send_mark(self, mark: bytes) -> None:
        """``mark`` to every stage-3 partition."""
        now_s = self.monotonic_s()
        self._heartbeat_due_s = now_s + HEARTBEAT_EVERY_S
        self._repeat_due_s = now_s + HEARTBEAT_REPEAT_S
        self._last_mark = mark
        for q in range(self.job_partitions):
            self.delivery.send(self.topic, b"~watermark", mark, partition=q)
