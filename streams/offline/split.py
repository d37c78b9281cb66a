"""Replay on two cores, the live topology offline: stage 2 in the reading process, stages 3 and
4 in a forked second one (and the archive's file reads, decompression and sample decoding in a
third, :mod:`~peerwatch.streams.offline.read_ahead`). Same outputs, in the same order, as the one-process
:class:`~peerwatch.streams.core.pipeline.Pipeline` (tested equal).

:class:`FrontPipeline` reads and aggregates the samples and, wherever the one-process pipeline
would close windows, sends the closed windows as columns instead of running the detector.
:class:`BackPipeline` receives them with every other record, in order, and runs stage 3 (the
detector) and stage 4 (the policy) exactly where the one-process pipeline runs them. Messages
(tuples, the first item names them):

* ``("feed", stream, key, value)``: a record of another stream than the samples;
* ``("drain", refused, max_ts_ms, watermark_ms, closed, names)``: a batch ended: the outputs
  of its late and invalid samples, the highest sample time aggregated, the watermark (None:
  none yet), the closed windows as columns (:class:`~peerwatch.streams.core.windows.ClosedWindows`,
  without their strings) and the strings (node names, UUIDs) the aggregator coded since the
  last message: this process keeps the list of them and makes the GpuWindow dicts, the reading
  process does not;
* ``("hot", findings)``: findings made beside stage 2 (hard rules on arrival), with the event
  time of each, for the policy;
* ``("saw", node_codes, ts_ms, names)``: the nodes and times of a part of the samples, for the
  silence watch, which runs in the stages process (it is off the reading process, the busier
  one); ``("silence", now_ms, names)``: its check, where the one-process pipeline checks;
  ``names`` as in ``drain``;
* ``("finish", closed, names, counters)``: end of input, every open window.

Both sides keep an allocation table (the front to attribute readings and fill a window's job
metadata, the back for job contexts and nodes) and apply the same events and prunes at the same
points.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from peerwatch import gc_tuning
from peerwatch.schemas.columns import ColumnDecoder
from peerwatch.schemas.compiled import Unsupported
from peerwatch.streams.core import loops
from peerwatch.streams.core.model import InvalidRecordError
from peerwatch.streams.core.pipeline import Output, Pipeline
from peerwatch.streams.core.settings import StageSettings
from peerwatch.streams.core.silence import newest_valid_ms
from peerwatch.streams.core.windows import ClosedWindows
from peerwatch.streams.offline.frames import FrameChannel, channel_pair, frames_of
from peerwatch.streams.offline.read_ahead import ReadAhead
from peerwatch.streams.offline.replay import Progress, Record, ReplayResult, collect, replay
from peerwatch.streams.offline.sample_runs import TablesOf, sample_decoder

Message = tuple[Any, ...]
_FAR_FUTURE_MS = 1 << 62
#: Bytes of messages the reading process may have written ahead of the stages process
#: (a window start's closed windows are about 300 bytes a GPU: some 30 MB at 100,000 GPUs).
SEND_AHEAD_BYTES = 64 << 20


class FrontPipeline(Pipeline):
    """Stage 2 of a split replay; everything else goes to ``send``. Its own methods return no
    outputs: the back pipeline makes them."""

    def __init__(self, settings: StageSettings, send: Callable[[Message], Any]) -> None:
        super().__init__(settings)
        self.send = send
        self._names_sent = 0

    def _new_names(self) -> list[str]:
        """The aggregator's strings not sent yet."""
        names = self.aggregator.names()
        new, self._names_sent = names[self._names_sent :], len(names)
        return new

    def feed(self, stream: str, key: str, value: Mapping[str, Any]) -> list[Output]:
        if stream == "samples":
            return super().feed(stream, key, value)
        if stream != "step-times":  # as Pipeline.feed: step times do not end a batch
            self._drain()
            event_ts = value.get("ts_ms")
            if isinstance(event_ts, int):  # the time of the refused samples' outputs
                self._stream_ms = max(self._stream_ms, event_ts)
            if stream == "job-events":
                # the back pipeline applies it too, and reports a bad one
                with contextlib.suppress(InvalidRecordError):
                    self.allocations.apply_event(value)
        self.send(("feed", stream, key, value))
        return []

    def _hot(self, found: list[tuple[Any, int]]) -> list[Output]:
        self.send(("hot", found))  # the back runs them through the policy, in this order
        return []

    def _saw(self, node_codes: np.ndarray, ts_ms: np.ndarray) -> int | None:
        # the silence watch is the back's: the part's nodes and times go there
        self.send(("saw", node_codes, ts_ms, self._new_names()))
        return newest_valid_ms(ts_ms)

    def _silence_check(self, now: int) -> list[Output]:
        self.send(("silence", now, self._new_names()))
        return []

    def _after_batch(self, out: list[Output]) -> list[Output]:
        agg = self.aggregator
        if agg.max_ts_ms is not None:
            self._stream_ms = max(self._stream_ms, agg.max_ts_ms)
        watermark = agg.watermark_ms
        closed: list[Any] = []
        if watermark is not None:
            closed = [c.without_names() for c in agg.pop_ready(watermark)]
            self._closed_to(watermark)
        self.send(("drain", out, agg.max_ts_ms, watermark, closed, self._new_names()))
        return []

    def finish(self) -> list[Output]:
        self._drain()
        closed = [c.without_names() for c in self.aggregator.pop_all()]
        self.send(("finish", closed, self._new_names(), self.counters()))
        return []


class BackPipeline(Pipeline):
    """Stages 3 and 4 of a split replay: :meth:`handle` each message of the front, in order."""

    def __init__(self, settings: StageSettings, emit_windows: bool = True) -> None:
        super().__init__(settings, emit_windows)
        self.front_counters: dict[str, int] = {}
        self._names: list[str] = []  # the reading process's aggregator's strings, by code
        self._key_cache: dict[int, str] = {}  # GPU keys made of them (ClosedWindows.key_cache)

    def _named(self, closed: list[ClosedWindows], names: list[str]) -> list[ClosedWindows]:
        self._names += names
        return [c._replace(names=self._names, key_cache=self._key_cache) for c in closed]

    def handle(self, message: Message) -> list[Output]:
        kind = message[0]
        if kind == "feed":
            _, stream, key, value = message
            return self.feed(stream, key, value)
        if kind == "drain":
            _, refused, max_ts_ms, watermark, closed, names = message
            closed = self._named(closed, names)
            out = list(refused)
            if max_ts_ms is not None:
                self._stream_ms = max(self._stream_ms, max_ts_ms)
            if watermark is None:
                return out
            out += self._detect(closed, watermark)
            self._closed_to(watermark)
            return out
        if kind == "hot":
            return self._hot(message[1])
        if kind == "saw":
            _, node_codes, ts_ms, names = message
            self._names += names
            self.silence.saw_columns(node_codes, ts_ms, self._names)
            return []
        if kind == "silence":
            _, now, names = message
            self._names += names
            return self._silence_check(now)
        if kind == "finish":
            _, closed, names, counters = message
            closed = self._named(closed, names)
            self.front_counters = dict(counters)
            return self._detect(closed, _FAR_FUTURE_MS)
        raise ValueError(f"unknown message {kind!r}")

    def counters(self) -> dict[str, int]:
        """The front's stage-2 counters (after finish), the silence and fleet watches' (they
        run here) and the step times seen here."""
        return {**self.front_counters, **self.silence.counters(), **self.jobs.fleet().counters(),
                "step_times": self.step_times}  # fmt: skip


class SplitReplay:
    """A replay on two cores (module docstring): the stages process starts here; feed
    :attr:`front` through :meth:`run`; :meth:`close` (or the ``with`` block) stops it."""

    def __init__(
        self,
        settings: StageSettings,
        *,
        job: str | None = None,
        node: str | None = None,
        keep_windows: bool = False,
        read_ahead: bool = False,
    ) -> None:
        self.settings = settings
        self.kept = {"job": job, "node": node, "keep_windows": keep_windows}
        loops.warm()  # before the fork: the stages process inherits the compiled loops
        #: ``read_ahead``: the archive blocks' reads, decompression and column decoding in a
        #: third process (None: here), for a caller that reads an archive; forked first, so
        #: that it holds no end of the stages process's channel
        self.read_ahead: ReadAhead | None = None
        #: how this replay reads and decodes an archive's sample blocks (for
        #: ``column_archive_records``; None: its default, here)
        self.tables_of: TablesOf | None = None
        if read_ahead:
            try:
                decoder: ColumnDecoder | None = sample_decoder()
            except Unsupported:  # no C module: the column path is refused where it is asked for
                decoder = None
            self.read_ahead = ReadAhead(decoder=decoder)
            if decoder is not None:
                self.tables_of = self.read_ahead.decoded_blocks
        ctx = multiprocessing.get_context("fork")
        self._here, there = channel_pair()
        self._proc = ctx.Process(
            target=_stages_main, args=(there, self._here, settings, job, node, keep_windows),
            name="peerwatch-replay-stages", daemon=True,
        )  # fmt: skip
        self._proc.start()
        there.close()
        self._done = False
        # after the fork: no thread goes into the child
        self._writer = PipeWriter(self._here, flush_kinds=_FLUSH_KINDS)
        self.front = FrontPipeline(settings, self._writer.send)

    def run(self, records: Iterable[Record], progress: Progress | None = None) -> ReplayResult:
        """Feed ``records`` to :attr:`front`; the result as the one-process replay gives it."""
        t0 = time.perf_counter()
        try:
            result = replay(records, self.settings, progress=progress, pipeline=self.front,
                            **self.kept)  # type: ignore[arg-type]  # fmt: skip
            self._writer.close()  # every message written
        except PipeClosed as exc:
            raise self._ended_early() from exc
        try:
            back: ReplayResult = self._here.recv()
        except (EOFError, OSError, ValueError) as exc:
            raise self._ended_early() from exc
        self._done = True
        result.findings, result.recommendations = back.findings, back.recommendations
        result.windows, result.late, result.invalid = back.windows, back.late, back.invalid
        result.wall_s = time.perf_counter() - t0
        return result

    def _ended_early(self) -> RuntimeError:
        self._proc.join(timeout=1.0)
        return RuntimeError(
            f"the replay's stages process ended early (exit code {self._proc.exitcode})"
        )

    def close(self) -> None:
        self._writer.stop()
        if not self._done:
            self._proc.kill()
        self._proc.join()
        self._writer.join()
        self._here.close()
        if self.read_ahead is not None:
            self.read_ahead.close()

    def __enter__(self) -> SplitReplay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PipeClosed(OSError):
    """The stages process no longer reads (it ended)."""


#: The messages after which the reading process's messages so far go to the stages process
#: (those it has work for; the others, small, ride with them: one frame, one wake-up of the
#: sender thread and of the stages process, for several messages).
_FLUSH_KINDS = frozenset({"drain", "finish"})
#: ... or once this many wait.
FLUSH_EVERY = 64


class PipeWriter:
    """The reading process's side of the channel: :meth:`send` gathers messages until one of
    ``flush_kinds`` (None: every message) or :data:`FLUSH_EVERY` of them, then pickles the list
    here (its arrays out of band, see :mod:`~peerwatch.streams.offline.frames`: the sender
    leaves them unchanged) and queues it, a thread writes the queue to the channel: the reader
    receives lists of messages, in order. The stages process works through a window start
    in a burst when it closes; with the pipe alone the reading process waited at each window
    start's message until the stages process was done with the last one (2.5-3 s of a 20 s
    replay). With the queue it reads on; at most ``limit_bytes`` of messages wait (one always
    may). A write that fails (the stages process ended) stops the thread and is raised, as
    :class:`PipeClosed`, by the next :meth:`send` that writes (a flush kind, or the
    :data:`FLUSH_EVERY`-th message gathered) or by :meth:`close`: never silently."""

    def __init__(
        self, channel: FrameChannel, limit_bytes: int = SEND_AHEAD_BYTES,
        flush_kinds: frozenset[str] | None = None,
    ) -> None:  # fmt: skip
        self._channel = channel
        self._flush_kinds = flush_kinds
        self._gathered: list[Message] = []
        self._limit = limit_bytes
        self._queue: deque[tuple[list[Any], int] | None] = deque()  # frames, size; None: stop
        self._waiting = 0  # bytes queued, not yet written
        self._cond = threading.Condition()
        self._error: Exception | None = None
        self._thread = threading.Thread(target=self._run, name="peerwatch-replay-send",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def send(self, message: Message) -> None:
        self._gathered.append(message)
        if (
            self._flush_kinds is None
            or message[0] in self._flush_kinds
            or len(self._gathered) >= FLUSH_EVERY
        ):
            self._flush()

    def _flush(self) -> None:
        if not self._gathered:
            return
        frames = frames_of(self._gathered)
        self._gathered = []
        size = frames[1]
        with self._cond:
            while self._waiting and self._waiting + size > self._limit and not self._error:
                self._cond.wait()
            self._raise_error()
            self._queue.append(frames)
            self._waiting += size
            self._cond.notify_all()

    def close(self) -> None:
        """After the last message: returns once every message is written."""
        self._flush()
        with self._cond:
            self._queue.append(None)
            self._cond.notify_all()
        self._thread.join()
        with self._cond:
            self._raise_error()

    def stop(self) -> None:
        """Drop what waits and end the thread (a replay given up)."""
        self._gathered = []
        with self._cond:
            self._queue.clear()
            self._queue.append(None)
            self._cond.notify_all()

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait for the thread to end; whether it did."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise PipeClosed(f"writing to the stages process: {self._error}") from self._error

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                data = self._queue.popleft()
            if data is None:
                return
            try:
                self._channel.send_frames(data[0])
            except Exception as exc:  # the stages process ended (OSError): told to the sender
                with self._cond:
                    self._error = exc
                    self._queue.clear()
                    self._cond.notify_all()
                return
            with self._cond:
                self._waiting -= data[1]
                self._cond.notify_all()


def _stages_main(
    conn: FrameChannel, theirs: FrameChannel, settings: StageSettings, job: str | None,
    node: str | None, keep_windows: bool,
) -> None:  # fmt: skip
    """The second process: every message through a BackPipeline, the kept outputs sent back
    at the end. ``theirs``: the reading process's end, inherited by the fork and closed here
    (so that this end sees the end of the stream when that process ends)."""
    theirs.close()
    gc_tuning.tune()
    back = BackPipeline(settings, emit_windows=keep_windows)
    result = ReplayResult()
    try:
        finished = False
        while not finished:
            for message in conn.recv():
                collect(result, back.handle(message), job, node, keep_windows)
                finished = message[0] == "finish"
    except EOFError:  # the reading process stopped (an error there, reported there)
        return
    conn.send(result)
    conn.close()
