"""The offline driver: allocation -> windows -> per-job detection -> drain policy, in one process.

The same four stages run in the live stream (keyed by node, job, node) and in replay; here they
are composed in one process for replay of a Kafka range or an archive, for the simulator and for
the evaluation harness. Each stage is a separable object with serialisable state:

1. :class:`~peerwatch.streams.core.allocation.AllocationTable` (JobEvents; keyed by node live);
2. :class:`~peerwatch.streams.core.windows.WindowAggregator` (sample batches; keyed by node);
3. :class:`~peerwatch.streams.core.job_stage.JobReleaser` (a job's windows from all its nodes ->
   ``detect_job_window``, findings routed to nodes; keyed by job);
4. :class:`PolicyStage` (findings, health results, node events -> ``policy.apply``; by node).

Beside stage 2, on the same sample columns (as the live hot stage):
:class:`~peerwatch.streams.core.hard_watch.HardWatch` (hard rules on arrival) and
:class:`~peerwatch.streams.core.silence.SilenceWatch` (allocated nodes gone quiet, checked every
``silent_check_s`` of event time, by the same
:class:`~peerwatch.streams.core.silence.SilenceClock` rule as live). Their findings go out, and
through the policy, at once; their outputs' ``stream_ms`` is the event time a live worker
publishes them at (the sample's time, or the check's).

Input: ``(stream, key, value)`` records in roughly event-time order, streams ``samples``,
``job-events``, ``node-events``, ``health``, the optional ``nic-samples`` (NodeNicSample: the
link rules of :class:`~peerwatch.streams.core.network_stage.NetworkStage`, findings out and
through the policy as the hard rules') and the optional ``step-times`` (per-rank step
durations: a GPU's window gets the mean ``step_ms`` of its steps in that window, see
:meth:`~peerwatch.streams.core.job_stage.JobStage.add_step`; without them the step feature is
simply not compared).
Output: :class:`Output` records. Deterministic: the same input gives the same output.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple, cast

import numpy as np

from peerwatch.schemas.columns import Table, slice_rows, tables_from_records
from peerwatch.schemas.records import DrainRecommendation, StragglerFinding
from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.hard_watch import HardWatch
from peerwatch.streams.core.job_stage import JobReleaser, Release
from peerwatch.streams.core.model import InvalidRecordError
from peerwatch.streams.core.network_stage import NetworkStage
from peerwatch.streams.core.policy import apply as policy_apply
from peerwatch.streams.core.policy_state import DrainPolicyState
from peerwatch.streams.core.settings import PolicySettings, StageSettings
from peerwatch.streams.core.silence import SilenceClock, SilenceWatch
from peerwatch.streams.core.windows import (
    SAMPLE_SPEC,
    BatchResult,
    ClosedWindows,
    WindowAggregator,
)

WINDOW = "window"
FINDING = "finding"
RECOMMENDATION = "recommendation"
LATE_SAMPLE = "late_sample"
INVALID = "invalid"
_FAR_FUTURE_MS = 1 << 62
#: Allocations and detector states are pruned at most this often (in event time); both are
#: kept for an hour after their end, so a minute more changes nothing.
PRUNE_EVERY_MS = 60_000
#: Most sample records handed to the aggregator at once (offline only; larger values measured
#: no faster, docs/performance.md).
MAX_BATCH = 1024


class Output(NamedTuple):
    """One output record. ``kind``: window, finding, recommendation, late_sample, invalid.

    ``stream_ms`` is the highest sample time the pipeline had seen when it produced the record:
    the event-time moment a live deployment would have published it (used for latencies). A
    named tuple: one is made per GPU window, at half the cost of a frozen dataclass.
    """

    kind: str
    key: str
    value: dict[str, Any]
    stream_ms: int


class PolicyStage:
    """Stage 4: the drain policy over findings, health results and node events (a JOB_WIDE
    finding reaches it once per node, routed by stage 3:
    :func:`~peerwatch.streams.core.job_stage.route_finding`)."""

    def __init__(self, settings: PolicySettings) -> None:
        self.settings = settings
        self.state = DrainPolicyState()

    def apply(self, record: Mapping[str, Any]) -> list[DrainRecommendation]:
        """Recommendations for one record. Raises InvalidRecordError for a record the policy
        rejects."""
        return policy_apply(record, self.state, self.settings)


class Pipeline:
    """All four stages in one process (see the module docstring)."""

    def __init__(
        self, settings: StageSettings, emit_windows: bool = True, max_batch: int = MAX_BATCH
    ) -> None:
        """``settings``: the live worker's settings objects (the tree's ``[stream]``,
        ``[detector]`` and ``[policy]`` tables; :class:`peerwatch.settings.Settings` is one).
        ``emit_windows``: yield every scored GpuWindow (WINDOW outputs); a replay that keeps
        only findings and recommendations turns it off. ``max_batch``: most sample records
        handed to the aggregator at once."""
        self.settings = settings
        self.max_batch = max_batch
        stream = settings.stream
        self.emit_windows = emit_windows
        self.allocations = AllocationTable(stream.allocation_retention_s * 1000)
        self.aggregator = WindowAggregator(
            self.allocations, settings.detector.window_s, stream.lateness_s, idle_jobs=True
        )
        self.jobs = JobReleaser(
            settings.detector,
            self.allocations,
            grace_ms=int(stream.job_grace_s * 1000),
            fan_out_job_wide=stream.fan_out_job_wide,
            scored_windows=emit_windows,
        )
        self.policy = PolicyStage(settings.policy)
        # Beside stage 2, on the same samples: hard rules on arrival and the silence watch.
        self.hard = HardWatch(self.allocations, self.aggregator.name, settings.detector)
        self.silence = SilenceWatch(
            int(stream.silent_after_s * 1000),
            int(stream.silent_group_s * 1000),
            stream.silent_fleet_min_nodes,
            settings.detector.window_ms,
            settings.detector.id_hex_chars,
            held=True,
        )
        self.silence_clock = SilenceClock(max(1, int(stream.silent_check_s * 1000)))
        # Beside stage 2 too, on the NIC samples: the network's link rules on arrival.
        self.network = NetworkStage(
            self.allocations,
            settings.network,
            settings.detector,
            readings_ms=2 * settings.detector.window_ms
            + int((stream.lateness_s + stream.job_grace_s) * 1000),
        )
        self._next_silence_ms = -_FAR_FUTURE_MS
        self._max_sample_ms = -_FAR_FUTURE_MS
        self._open_nodes: dict[str, tuple[str, int]] = {}
        self._open_generation = -1
        self.step_times = 0
        self._batch: list[Mapping[str, Any]] = []
        self._pending = 0  # samples of column runs aggregated since the last drain
        self._refused: list[tuple[str, dict[str, Any]]] = []  # their late and invalid ones
        self._next_close_ms = -_FAR_FUTURE_MS
        self._next_prune_ms = -_FAR_FUTURE_MS
        self._stream_ms = -_FAR_FUTURE_MS

    # -- driving --------------------------------------------------------------------------------
    def run(self, records: Iterable[tuple[str, str, Mapping[str, Any]]]) -> Iterator[Output]:
        """Feed every record, then :meth:`finish`; yields outputs as they are produced."""
        for stream, key, value in records:
            yield from self.feed(stream, key, value)
        yield from self.finish()

    def feed(self, stream: str, key: str, value: Mapping[str, Any]) -> list[Output]:
        """One input record; returns what it caused (often nothing until a window closes)."""
        if stream == "samples":
            self._batch.append(value)
            ts = int(value["ts_ms"])
            # A part ends at the first sample at or past the next closing time (so outputs come
            # out at the event time a live stream would publish them) or silence check.
            if (
                ts >= min(self._next_close_ms, self._next_silence_ms)
                or len(self._batch) + self._pending >= self.max_batch
            ):
                return self._part_done(self._flush_batch(), ts)
            return []
        if stream == "nic-samples":
            # The GPU samples before it first (their hard rules), so findings keep event order.
            out = self._flush_batch()
            found = self.network.add_nic([value])
            return out + self._hot([(f, int(f["detected_ms"] or 0)) for f in found])
        if stream == "step-times":
            self.step_times += 1
            try:
                self.jobs.add_step(value)
            except InvalidRecordError as exc:  # as live: dead-lettered, counted
                return [self._invalid(stream, key, value, exc)]
            return []
        out = self._drain()
        event_ts = value.get("ts_ms")
        if isinstance(event_ts, int):
            self._stream_ms = max(self._stream_ms, event_ts)
        try:
            if stream == "job-events":
                try:
                    self.allocations.apply_event(value)
                finally:
                    self._allocations_changed()
            elif stream in ("node-events", "health", "health-results"):
                out += self._recommend(value)
        except InvalidRecordError as exc:
            out.append(self._invalid(stream, key, value, exc))
        return out

    def finish(self) -> list[Output]:
        """End of input: close every open window and release every held job window."""
        out = self._drain()
        out += self._detect(self.aggregator.pop_all(), _FAR_FUTURE_MS)
        return out

    # -- stages ---------------------------------------------------------------------------------
    def feed_columns(self, tables: Mapping[str, Table]) -> list[Output]:
        """A run of samples as columns (:data:`~peerwatch.streams.core.windows.SAMPLE_SPEC`,
        string codes of ``aggregator.strings``), in replay order: the same outputs, at the same
        points, as feeding them one by one to :meth:`feed`."""
        out = self._drain() if self._batch else []
        n = tables[""].n
        ts = tables[""].values["ts_ms"]
        start = aggregated = 0
        while start < n:
            end = min(n, start + self.max_batch - self._pending)
            # the first sample at or past the next closing (or silence check) time ends the
            # batch (it is in it)
            cut = min(self._next_close_ms, self._next_silence_ms)
            hits = np.flatnonzero(ts[start:end] >= cut)
            if hits.size:
                end = start + int(hits[0]) + 1
            part = slice_rows(tables, start, end)
            out += self._arrivals(part)
            self._saw_columns(part)
            self._pending += end - start
            start = end
            last_ts_ms = int(ts[end - 1])
            if last_ts_ms >= self._next_close_ms or self._pending >= self.max_batch:
                # a drain follows: the aggregator first takes every sample before it
                self._aggregate_rows(tables, aggregated, end)
                aggregated = end
            out += self._part_done([], last_ts_ms)
        self._aggregate_rows(tables, aggregated, n)
        return out

    def _aggregate_rows(self, tables: Mapping[str, Table], lo: int, hi: int) -> None:
        """Rows ``[lo, hi)`` of a column run to the aggregator, in one call (its late and
        invalid samples kept for the next drain). Nothing reads the aggregator between two
        drains, so the parts a run is cut into for the hard rules and the silence watch (each
        second) go to it together: fewer calls, the same state at every drain."""
        if lo >= hi:
            return
        rows = tables if lo == 0 and hi == tables[""].n else slice_rows(tables, lo, hi)
        self._refuse(self.aggregator.add_columns(rows), functools.partial(self._sample_of, rows))

    def _flush_batch(self) -> list[Output]:
        """The decoded samples gathered by :meth:`feed`, as one part."""
        if not self._batch:
            return []
        batch, self._batch = self._batch, []
        tables = tables_from_records(SAMPLE_SPEC, batch, self.aggregator.strings)
        return self._part(tables, lambda r: dict(batch[r]))

    def _part(
        self, tables: Mapping[str, Table], sample_of: Callable[[int], dict[str, Any]]
    ) -> list[Output]:
        """One part of the samples: hard rules on arrival, the silence watch's last times, the
        aggregator (late and invalid samples kept for the next drain)."""
        out = self._arrivals(tables)
        self._saw_columns(tables)
        self._refuse(self.aggregator.add_columns(tables), sample_of)
        self._pending += tables[""].n
        return out

    def _refuse(self, result: BatchResult, sample_of: Callable[[int], dict[str, Any]]) -> None:
        """Keep the late and invalid samples of an aggregated batch for the next drain."""
        for kind, rows in ((LATE_SAMPLE, result.late), (INVALID, result.invalid)):
            self._refused += [(kind, sample_of(r)) for r in rows.tolist()]

    def _part_done(self, out: list[Output], last_ts_ms: int) -> list[Output]:
        """After a part ending with a sample at ``last_ts_ms``: a drain when it closes windows
        or fills a batch, then the silence check when it is due."""
        if last_ts_ms >= self._next_close_ms or self._pending >= self.max_batch:
            out += self._drain()
        if self._max_sample_ms >= self._next_silence_ms:
            out += self._check_silence()
        return out

    def _saw_columns(self, tables: Mapping[str, Table]) -> None:
        """The silence watch's last sample time of each node of a column batch."""
        top = tables[""]
        newest = self._saw(top.values["node"], top.values["ts_ms"])
        if newest is not None:
            self._max_sample_ms = max(self._max_sample_ms, newest)
            self.silence_clock.saw(0, newest)

    def _saw(self, node_codes: np.ndarray, ts_ms: np.ndarray) -> int | None:
        """Samples of these nodes (aggregator string codes) at these times to the silence
        watch; returns the latest valid time (None: none valid)."""
        seen = self.silence.saw_columns(node_codes, ts_ms, self.aggregator.names())
        return None if seen is None else seen[1]

    # -- hard rules on arrival, silence ---------------------------------------------------------
    def _arrivals(self, tables: Mapping[str, Table]) -> list[Output]:
        """Hard rules on arrival over a column batch (before its aggregation)."""
        found = self.hard.add_columns(tables)
        return self._hot([(f, int(f["detected_ms"] or 0)) for f in found]) if found else []

    def _check_silence(self) -> list[Output]:
        """The silence checks now due (:class:`~peerwatch.streams.core.silence.SilenceClock`:
        one source here, every samples partition live), each at its own time."""
        out: list[Output] = []
        for now in self.silence_clock.due():
            out += self._silence_check(now)
        nxt = self.silence_clock.next_ms
        self._next_silence_ms = -_FAR_FUTURE_MS if nxt is None else nxt
        return out

    def _silence_check(self, now: int) -> list[Output]:
        """The silence watch's check at sample time ``now``: findings through :meth:`_hot`."""
        if self.allocations.generation != self._open_generation:
            self._open_generation = self.allocations.generation
            self._open_nodes = self.allocations.open_nodes()
        found = self.silence.check(self._open_nodes, now)
        return self._hot([(f, now) for f in found]) if found else []

    def _hot(self, found: list[tuple[StragglerFinding, int]]) -> list[Output]:
        """Findings made beside stage 2 (hard rules on arrival, silence), each with the event
        time a live worker publishes it at: out as findings, and through the policy."""
        out: list[Output] = []
        for f, stream_ms in found:
            out.append(Output(FINDING, str(f["job_id"]), dict(f), stream_ms))
            if f.get("node") is not None:
                out += self._recommend(f, stream_ms)
        return out

    def _sample_of(self, tables: Mapping[str, Table], row: int) -> dict[str, Any]:
        """What a late or invalid sample of a column batch is reported as: node and time."""
        top = tables[""]
        return {
            "node": self.aggregator.name(int(top.values["node"][row])),
            "ts_ms": int(top.values["ts_ms"][row]),
        }

    def _drain(self) -> list[Output]:
        out = self._flush_batch()
        if not self._pending:
            return out
        self._pending = 0
        refused, self._refused = self._refused, []
        out += [
            Output(kind, str(s.get("node")), s, self._stream_ms)
            if kind == LATE_SAMPLE
            else self._invalid("samples", str(s.get("node")), s, ValueError("time out of range"))
            for kind, s in sorted(refused, key=lambda r: r[0] != LATE_SAMPLE)
        ]
        return self._after_batch(out)

    def _after_batch(self, out: list[Output]) -> list[Output]:
        """After a batch went through the aggregator: late samples out, windows closed and
        detected, state pruned."""
        if self.aggregator.max_ts_ms is not None:
            self._stream_ms = max(self._stream_ms, self.aggregator.max_ts_ms)
        watermark = self.aggregator.watermark_ms
        if watermark is None:
            return out
        out += self._detect(self.aggregator.pop_ready(watermark), watermark)
        self._closed_to(watermark)
        return out

    def _closed_to(self, watermark_ms: int) -> None:
        """After windows closed at ``watermark_ms``: the next closing time; state pruned once
        the watermark moved a minute on (pruning walks every allocation: not at every batch)."""
        closed = self.aggregator.closed_until_ms or 0
        self._next_close_ms = closed + self.aggregator.window_ms + self.aggregator.lateness_ms
        if watermark_ms < self._next_prune_ms:
            return
        self._next_prune_ms = watermark_ms + PRUNE_EVERY_MS
        if self.allocations.prune(watermark_ms):
            self._allocations_changed()
        self.jobs.prune(watermark_ms, self.settings.stream.allocation_retention_s * 1000)
        self.hard.prune(watermark_ms - self.settings.stream.allocation_retention_s * 1000)
        self.network.prune(watermark_ms - self.settings.stream.allocation_retention_s * 1000)

    def _allocations_changed(self) -> None:
        """Hook: the allocation table changed (events applied or pruned)."""

    def _detect(self, closed: list[ClosedWindows], watermark_ms: int) -> list[Output]:
        """Stage 3 offline on closed windows: one source (every node) on one channel, its
        watermark the aggregator's. The channel's fleet watch gets the windows' censuses (as
        live, where every samples partition sends its own), then the windows become dicts per
        job; the heartbeat judges the fleet first (a window of a partition in a fleet shift
        gets its ratio when released)."""
        fleet_watch = self.jobs.fleet()
        fleet_watch.add_closed(0, closed)
        for b in self.aggregator.group(closed):
            self.jobs.add(b, src=0)
        out: list[Output] = []
        try:
            released = self.jobs.heartbeat(0, watermark_ms)
        except InvalidRecordError as exc:  # pragma: no cover - the aggregator builds valid windows
            return [self._invalid("job-windows", "", {}, exc)]
        fleet = [
            Output(FINDING, str(f["job_id"]), dict(f), self._stream_ms) for f in released.fleet
        ]
        for r in released.releases:
            job_id = r.context.job_id
            if self.emit_windows:  # scored in place: the aggregator made them for this use only
                out += [
                    Output(WINDOW, job_id, cast(dict[str, Any], w), self._stream_ms)
                    for w in r.result.windows
                ]
            for f, copies in zip(r.result.findings, r.to_nodes, strict=True):
                out.append(Output(FINDING, job_id, dict(f), self._stream_ms))
                for copy in copies:
                    out += self._recommend(copy)
            out += self._network_window(r)
        return out + fleet

    def _network_window(self, r: Release) -> list[Output]:
        """The job's network compared across its nodes at a released window (findings out and
        through the policy: each names a node and a port, no GPU)."""
        job_id = r.context.job_id
        job_wide = r.result.job_wide  # the GPU detector's verdict for this window
        end_ms = r.window_start_ms + self.settings.detector.window_ms
        found = self.network.job_window(
            job_id, r.window_start_ms, end_ms, self.allocations.nodes_of(job_id), job_wide
        )
        out: list[Output] = []
        for f in found:
            out.append(Output(FINDING, job_id, dict(f), self._stream_ms))
            out += self._recommend(f)
        return out

    def _recommend(self, record: Mapping[str, Any], stream_ms: int | None = None) -> list[Output]:
        try:
            recs = self.policy.apply(record)
        except InvalidRecordError as exc:
            return [self._invalid("policy", str(record.get("node")), record, exc)]
        at = self._stream_ms if stream_ms is None else stream_ms
        return [Output(RECOMMENDATION, r["node"], dict(r), at) for r in recs]

    def _invalid(self, stream: str, key: str, value: Mapping[str, Any], exc: Exception) -> Output:
        return Output(
            INVALID,
            key,
            {"stream": stream, "error": str(exc), "record": dict(value)},
            self._stream_ms,
        )

    def counters(self) -> dict[str, int]:
        """The aggregator's, the hard watch's and the silence watch's counters plus step-time
        records seen."""
        return {
            **self.aggregator.counters(),
            **self.hard.counters(),
            **self.silence.counters(),
            **self.jobs.fleet().counters(),
            **self.network.counters(),
            "step_times": self.step_times,
        }


def run_records(
    records: Iterable[tuple[str, str, Mapping[str, Any]]], settings: StageSettings
) -> list[Output]:
    """Convenience: run a fresh :class:`Pipeline` over ``records`` and return every output."""
    return list(Pipeline(settings).run(records))
