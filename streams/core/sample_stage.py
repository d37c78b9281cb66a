"""Stage 2 as one pure object: samples in, closed windows, censuses and findings out.

The live worker (:mod:`~peerwatch.streams.live.hot_stage`), replay and the evaluation harness
(:class:`~peerwatch.streams.core.pipeline.Pipeline`) run this same object; they differ only in
their source (Kafka partitions, an archive, a simulator), the clock they pass (event time;
live, the wall clock once every partition is quiet: :meth:`SampleStage.silence_due`) and the
channel that carries its outputs to stage 3 (a Kafka topic, or a call in process).

It owns, for one worker or one replay:

* the allocation view (:class:`~peerwatch.streams.core.allocation.AllocationTable`, every
  JobEvent of the cluster: :meth:`SampleStage.apply_job_event`);
* per source (a samples partition live, one source offline) a
  :class:`~peerwatch.streams.core.windows.WindowAggregator` and a
  :class:`~peerwatch.streams.core.hard_watch.HardWatch` (hard rules on arrival);
* one :class:`~peerwatch.streams.core.silence.SilenceWatch` and its
  :class:`~peerwatch.streams.core.silence.SilenceClock` over every source;
* the source's fleet census of each window start it closes
  (:func:`~peerwatch.streams.core.fleet.censuses_closed`: stage 3's fleet watch merges every
  source's, one decision for the fleet, live and offline alike);
* the :class:`~peerwatch.streams.core.network_stage.NetworkStage` (NIC samples: link rules on
  arrival; at each close, every job's ports summarised over the closed windows for stage 3's
  job comparison, and the leaf-switch grouping across jobs);
* every cadence: windows close after each step at the aggregator's watermark
  (:meth:`SampleStage.due_ms` says the event time of the next close or silence check, where a
  runner that cuts its input gets outputs at the event time a live worker has them), state is
  pruned once :data:`PRUNE_EVERY_MS` of the slowest source's watermark.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np

from peerwatch.schemas.columns import Table
from peerwatch.schemas.records import StragglerFinding
from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.fleet import SourceCensus, censuses_closed
from peerwatch.streams.core.hard_watch import HardWatch
from peerwatch.streams.core.network_jobs import JobPorts
from peerwatch.streams.core.network_stage import NetworkStage
from peerwatch.streams.core.network_stage import readings_ms as nic_readings_ms
from peerwatch.streams.core.settings import StageSettings
from peerwatch.streams.core.silence import SilenceClock, SilenceWatch
from peerwatch.streams.core.topology import Topology
from peerwatch.streams.core.windows import ClosedWindows, WindowAggregator

_FAR_PAST_MS = -(1 << 62)
#: Allocations, hard-rule memories and NIC readings are pruned at most this often (event time,
#: ms, by the slowest source's watermark); all are kept for an hour after their end, so a
#: minute more changes nothing.
PRUNE_EVERY_MS = 60_000

#: One source's census of one window start: (start ms, end ms, Slurm partition -> its share).
Census = tuple[int, int, dict[str, SourceCensus]]


class StepResult(NamedTuple):
    """What one :meth:`SampleStage.step` made (rows are those of the tables it was given)."""

    #: hard-rule findings on arrival, in sample order (``detected_ms``: the sample's time)
    hard: list[StragglerFinding]
    #: rows of samples for a window already closed (late) and with a time out of range
    late: np.ndarray
    invalid: np.ndarray
    #: the windows this step closed, as the aggregator's columns (in start order)
    closed: list[ClosedWindows]
    #: the source's fleet census of each window start in ``closed``
    censuses: list[Census]
    #: each job's ports over the windows in ``closed`` (stage 3 compares them at release)
    ports: list[JobPorts]
    #: leaf-switch findings of the windows in ``closed`` (no node: the findings topic only)
    switches: list[StragglerFinding]
    #: the source's watermark after the step (ms; None: no valid sample yet)
    watermark_ms: int | None
    #: the newest valid sample time of the step (ms, the silence clock's; None: none valid)
    newest_ms: int | None
    #: the watermark state was pruned at in this step (ms; None: not pruned), for stage 3
    pruned_ms: int | None


class _Source:
    """One source's aggregator and hard watch."""

    def __init__(self, aggregator: WindowAggregator, hard: HardWatch) -> None:
        self.aggregator = aggregator
        self.hard = hard


class SampleStage:
    """Stage 2 (module docstring). Pure: no I/O, no wall clock; the runner passes time."""

    def __init__(
        self,
        settings: StageSettings,
        *,
        readings_ms: int | None = None,
        partition_of: Callable[[str], int] | None = None,
        topology: Topology | None = None,
    ) -> None:
        """``settings``: the tree's ``[stream]``, ``[detector]``, ``[network]`` tables.
        ``readings_ms``: how long the NIC readings are kept for the per-window port summaries
        (ms; None: :func:`~peerwatch.streams.core.network_stage.readings_ms`; 0: none kept,
        none summarised). ``partition_of``: the source of a node (live: the producers'
        partitioner), so the silence watch looks only at the nodes of the sources held (None:
        every allocated node). ``topology``: the leaf switches (the runner reads them:
        :func:`~peerwatch.streams.core.topology.live_topology`; None: no switch grouping)."""
        stream, detector = settings.stream, settings.detector
        self.settings = settings
        self.retention_ms = stream.allocation_retention_s * 1000
        self.allocations = AllocationTable(self.retention_ms)
        self.sources: dict[int, _Source] = {}
        self.silence = SilenceWatch(
            int(stream.silent_after_s * 1000),
            int(stream.silent_group_s * 1000),
            stream.silent_fleet_min_nodes,
            detector.window_ms,
            detector.id_hex_chars,
            held=True,
        )
        self.silence_clock = SilenceClock(max(1, int(stream.silent_check_s * 1000)))
        self.network = NetworkStage(
            self.allocations,
            settings.network,
            detector,
            readings_ms=nic_readings_ms(settings) if readings_ms is None else readings_ms,
            topology=topology,
        )
        self.partition_of = partition_of
        self.last_prune_ms = _FAR_PAST_MS
        self._watched: dict[str, tuple[str, int]] = {}
        self._watched_key: tuple[int, frozenset[int]] | None = None

    # -- sources ----------------------------------------------------------------------------------
    def open_source(self, src: int, closed_until_ms: int | None = None) -> WindowAggregator:
        """Start source ``src`` (a fresh aggregator and hard watch; ``closed_until_ms``: windows
        ending at or before it were closed before, e.g. by a worker before a restart)."""
        detector, stream = self.settings.detector, self.settings.stream
        agg = WindowAggregator(self.allocations, detector.window_s, stream.lateness_s,
                               idle_jobs=True)  # fmt: skip
        agg.closed_until_ms = closed_until_ms
        self.sources[src] = _Source(agg, HardWatch(self.allocations, agg.name, detector))
        return agg

    def close_source(self, src: int) -> None:
        """Forget source ``src`` (live: a partition revoked or lost)."""
        self.sources.pop(src, None)

    def aggregator(self, src: int = 0) -> WindowAggregator:
        """Source ``src``'s aggregator (opened on first use)."""
        source = self.sources.get(src)
        return source.aggregator if source is not None else self.open_source(src)

    def hard(self, src: int = 0) -> HardWatch:
        """Source ``src``'s hard watch (opened on first use)."""
        if src not in self.sources:
            self.open_source(src)
        return self.sources[src].hard

    # -- inputs -----------------------------------------------------------------------------------
    def apply_job_event(self, value: Mapping[str, Any]) -> None:
        """One JobEvent to the allocation view. Raises InvalidRecordError (or KeyError,
        ValueError, TypeError on a malformed record) and applies nothing then."""
        self.allocations.apply_event(value)

    def add_nic(self, samples: Iterable[Mapping[str, Any]]) -> list[StragglerFinding]:
        """NIC samples (NodeNicSample) through the link rules; their findings, in order."""
        return self.network.add_nic(samples)

    def step(self, tables: Mapping[str, Table], src: int = 0) -> StepResult:
        """A batch of source ``src``'s samples as columns
        (:data:`~peerwatch.streams.core.windows.SAMPLE_SPEC`, string codes of the source's
        aggregator): hard rules on arrival, the silence watch's sample times, aggregation, the
        windows the new watermark closes with their censuses, and a prune when due."""
        source = self.sources.get(src)
        if source is None:
            self.aggregator(src)
            source = self.sources[src]
        agg = source.aggregator
        hard = source.hard.add_columns(tables)
        top = tables[""]
        seen = self.silence.saw_columns(top.values["node"], top.values["ts_ms"], agg.names())
        newest = None if seen is None else seen[1]
        if newest is not None:
            self.silence_clock.saw(src, newest)
        result = agg.add_columns(tables)
        watermark = agg.watermark_ms
        closed = agg.pop_ready(watermark) if watermark is not None else []
        censuses = censuses_closed(closed, self.settings.detector.fleet_cap_frac) if closed else []
        ports, switches = self.network.closed(closed) if closed else ([], [])
        return StepResult(hard, result.late, result.invalid, closed, censuses, ports, switches,
                          watermark, newest, self._prune())  # fmt: skip

    def finish(
        self, src: int = 0
    ) -> tuple[list[ClosedWindows], list[Census], list[JobPorts], list[StragglerFinding]]:
        """End of input of source ``src``: every open window closed, with its censuses, its
        jobs' ports and its switch findings."""
        closed = self.aggregator(src).pop_all()
        ports, switches = self.network.closed(closed)
        return (closed, censuses_closed(closed, self.settings.detector.fleet_cap_frac), ports,
                switches)  # fmt: skip

    # -- cadences ---------------------------------------------------------------------------------
    def next_close_ms(self, src: int = 0) -> int:
        """The earliest sample time whose watermark may close a window of source ``src`` (ms;
        far in the past before its first window: any sample)."""
        agg = self.aggregator(src)
        if agg.watermark_ms is None:
            return _FAR_PAST_MS
        return (agg.closed_until_ms or 0) + agg.window_ms + agg.lateness_ms

    @property
    def next_silence_ms(self) -> int:
        """The event time of the next silence check (ms; far in the past before any sample)."""
        nxt = self.silence_clock.next_ms
        return _FAR_PAST_MS if nxt is None else nxt

    def due_ms(self, src: int = 0) -> int:
        """The event time at which this stage next does something beyond aggregating (closes
        windows of ``src`` or checks silence): a runner that ends its batch at the first sample
        at or past it hands on outputs at the event time a live worker does."""
        return min(self.next_close_ms(src), self.next_silence_ms)

    def silence_due(
        self, sources: Iterable[int] | None = None, now_ms: int | None = None
    ) -> list[int]:
        """The silence checks now due (:meth:`SilenceClock.due`): every check time all of
        ``sources`` reached (default: every source seen), or ``now_ms`` (live, a worker whose
        partitions are all quiet: the runner's clock)."""
        return self.silence_clock.due(sources, now_ms)

    def check_silence(self, now_ms: int) -> list[StragglerFinding]:
        """The silence watch's check at event time ``now_ms`` over the allocated nodes of the
        sources held (every allocated node without ``partition_of``)."""
        key = (self.allocations.generation, frozenset(self.sources))
        if key != self._watched_key:
            self._watched_key = key
            open_nodes = self.allocations.open_nodes()
            part_of = self.partition_of
            self._watched = (
                open_nodes
                if part_of is None
                else {n: v for n, v in open_nodes.items() if part_of(n) in self.sources}
            )
        return self.silence.check(self._watched, now_ms)

    def _prune(self) -> int | None:
        """Prune once :data:`PRUNE_EVERY_MS` of the slowest source's watermark passed (pruning
        walks every allocation: not at every step; the slowest, which may still need the
        allocations of jobs that ended). Returns the watermark pruned at (None: not now)."""
        marks = [s.aggregator.watermark_ms for s in self.sources.values()]
        slowest = min((w for w in marks if w is not None), default=None)
        if slowest is None or slowest < self.last_prune_ms + PRUNE_EVERY_MS:
            return None
        self.last_prune_ms = slowest
        self.allocations.prune(slowest)
        for source in self.sources.values():
            source.hard.prune(slowest - self.retention_ms)
        self.network.prune(slowest - self.retention_ms)
        return slowest

    # -- state --------------------------------------------------------------------------------------
    def counters(self) -> dict[str, int]:
        """The aggregators' (summed over sources), hard watches', silence watch's and
        network's counters."""
        out: dict[str, int] = {}
        for source in self.sources.values():
            for name, value in (*source.aggregator.counters().items(),
                                *source.hard.counters().items()):  # fmt: skip
                out[name] = out.get(name, 0) + value
        return {**out, **self.silence.counters(), **self.network.counters()}

    def snapshot(self) -> dict[str, Any]:
        """The state a restarted runner needs that its source cannot give again: the
        allocation view, the NIC state, each source's closed-until and the silence clock
        (JSON-able; the open windows are rebuilt by reading the source again from the committed
        point, as the live worker does)."""
        clock = self.silence_clock
        return {
            "allocations": self.allocations.to_dict(),
            "network": self.network.snapshot(),
            "closed_until_ms": {
                str(s): src.aggregator.closed_until_ms for s, src in self.sources.items()
            },
            "silence_clock": {
                "latest": {str(s): t for s, t in clock.latest.items()},
                "next_ms": clock.next_ms,
            },
            "last_prune_ms": self.last_prune_ms,
        }

    def restore(self, data: Mapping[str, Any]) -> None:
        """State from :meth:`snapshot` (raises KeyError, TypeError, ValueError on a malformed
        one, before changing anything it cannot take)."""
        AllocationTable.from_dict(data["allocations"])  # refused here, before any change
        closed = {int(s): (None if u is None else int(u))
                  for s, u in dict(data["closed_until_ms"]).items()}  # fmt: skip
        clock = dict(data["silence_clock"])
        latest = {int(s): int(t) for s, t in dict(clock["latest"]).items()}
        next_ms = None if clock["next_ms"] is None else int(clock["next_ms"])
        last_prune_ms = int(data["last_prune_ms"])
        network = data["network"]
        # into the same table object: the network stage and the aggregators read it
        self.allocations._load(data["allocations"])
        self.allocations.generation += 1
        self.network.restore(network)
        self.sources.clear()
        for src, until in sorted(closed.items()):
            self.open_source(src, until)
        self.silence_clock.latest = latest
        self.silence_clock.next_ms = next_ms
        self.last_prune_ms = last_prune_ms
        self._watched_key = None
