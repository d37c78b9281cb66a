"""The native replay pipeline cut in two, the live topology offline: stage 2 in one process,
stages 3 and 4 in another, so that a replay uses two cores.

:class:`FrontPipeline` (the replay's own process) reads and aggregates the samples
(:class:`~peerwatch.streams.offline.windows_native.NativePipeline`'s C path) and, wherever the
one-process pipeline would close windows, sends the closed accumulators instead of running the
detector. :class:`BackPipeline` (a second process) receives them with every other record, in the
same order, and runs the GpuWindow building, stage 3 (detector) and stage 4 (policy) exactly where
the one-process pipeline runs them: same outputs, same order (tested against
:class:`~peerwatch.streams.core.pipeline.Pipeline`).

Messages, in order (each a tuple; the first item names it):

* ``("feed", stream, key, value)``: a record of another stream than the samples;
* ``("drain", late samples, max_ts_ms, closed)``: a batch ended: its late samples, the highest
  sample time aggregated, and the closed ``(node, window start, accumulator values)`` triples
  (the values of ``_Acc``'s fields, a plain tuple);
* ``("finish", max_ts_ms, closed, counters)``: end of input, every open window.

Both sides keep an allocation table (the front to attribute readings, the back for job
contexts) and apply the same events and prunes at the same points.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from peerwatch.streams.core.model import InvalidRecordError
from peerwatch.streams.core.pipeline import Output, Pipeline, PipelineSettings
from peerwatch.streams.core.windows import WindowAggregator
from peerwatch.streams.offline.windows_native import AccValues, NativePipeline

Message = tuple[Any, ...]


class FrontPipeline(NativePipeline):
    """Stage 2 of a native replay; everything else goes to ``send`` (module docstring). Its
    own methods return no outputs: the back pipeline makes them."""

    def __init__(
        self, settings: PipelineSettings, node_ids: dict[str, int], send: Callable[[Message], Any]
    ) -> None:
        # Closed accumulators as plain tuples: pickled twenty times faster than namedtuples.
        super().__init__(settings, node_ids, acc_type=tuple)
        self.send = send

    def feed(self, stream: str, key: str, value: Mapping[str, Any]) -> list[Output]:
        if stream == "samples":
            raise TypeError("FrontPipeline takes samples as SampleRuns (feed_samples)")
        if stream != "step-times":  # as Pipeline.feed: step times do not end a batch
            self._drain()
            if stream == "job-events":
                try:
                    self.allocations.apply_event(value)
                except InvalidRecordError:
                    pass  # the back pipeline applies it too, and reports it
                finally:
                    self._allocations_changed()
        self.send(("feed", stream, key, value))
        return []

    def _after_batch(self, late: list[Mapping[str, Any]]) -> list[Output]:
        agg = self.aggregator
        watermark = agg.watermark_ms
        closed: list[tuple[str, int, Any]] = []
        if watermark is not None:
            closed = agg.pop_ready(watermark)
            self._closed_to(watermark)
        self.send(("drain", late, agg.max_ts_ms, closed))
        return []

    def finish(self) -> list[Output]:
        self._drain()
        agg = self.aggregator
        self.send(("finish", agg.max_ts_ms, agg.pop_all(), self.counters()))
        return []


class ReceivedWindows(WindowAggregator):
    """The back pipeline's stage 2: windows closed by the front, handed in by :meth:`receive`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._received: list[tuple[str, int, Any]] = []

    def receive(self, max_ts_ms: int | None, closed: list[tuple[str, int, Any]]) -> None:
        self.max_ts_ms = max_ts_ms
        self._received = closed

    def _pop(self, watermark_ms: int | None) -> Iterator[tuple[str, int, Any]]:
        got, self._received = self._received, []
        make = AccValues._make
        for node, start, values in got:
            yield node, start, make(values)

    def add_batch(self, samples: Any) -> list[Mapping[str, Any]]:
        raise TypeError("ReceivedWindows only receives closed windows")


class BackPipeline(Pipeline):
    """Stages 3 and 4 of a split replay: :meth:`handle` each message of the front, in order."""

    def __init__(self, settings: PipelineSettings) -> None:
        super().__init__(settings)
        self.aggregator: ReceivedWindows = ReceivedWindows(
            self.allocations, settings.detector.window_s, settings.lateness_s, idle_jobs=True
        )
        self._front_counters: dict[str, int] = {}

    def handle(self, message: Message) -> list[Output]:
        kind = message[0]
        if kind == "feed":
            _, stream, key, value = message
            return self.feed(stream, key, value)
        if kind == "drain":
            _, late, max_ts_ms, closed = message
            self.aggregator.receive(max_ts_ms, closed)
            return self._after_batch(late)
        if kind == "finish":
            _, max_ts_ms, closed, counters = message
            self.aggregator.receive(max_ts_ms, closed)
            self._front_counters = dict(counters)
            return self.finish()
        raise ValueError(f"unknown message {kind!r}")

    def counters(self) -> dict[str, int]:
        """The front's stage-2 counters (after finish) and the step times seen here."""
        return {**self._front_counters, "step_times": self.step_times}
