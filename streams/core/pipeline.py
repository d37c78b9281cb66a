"""The in-process runner: the four stages in one process, the channel a call.

The live worker and this runner run the same stage objects; here they are composed in one
process for replay of a Kafka range or an archive, for the simulator and for the evaluation
harness:

1. :class:`~peerwatch.streams.core.sample_stage.SampleStage` (stage 2: allocations, windows,
   the hard, silence and link watches, the fleet censuses, every cadence);
2. :class:`~peerwatch.streams.core.job_stage.JobReleaser` (stage 3: a job's windows from all its
   nodes -> ``detect_job_window``, the fleet watch, findings routed to nodes);
3. :class:`~peerwatch.streams.core.policy_stage.PolicyStage` (stage 4: findings, health results,
   node events -> ``policy.apply``).

The source is a sequence of records in roughly event-time order; the clock is their event time.
A batch of samples ends at the first sample at or past :meth:`SampleStage.due_ms` (a window
closes, or a silence check is due) or at ``max_batch`` samples, so outputs come out at the event
time a live worker publishes them. What stage 2 made in a batch goes to stage 3 at its end (the
"drain"): late and invalid samples, closed windows with their censuses, then a heartbeat at the
watermark. Findings made on arrival (hard rules, silence, link rules) go out, and through the
policy, at once; their outputs' ``stream_ms`` is the event time a live worker publishes them at.

Input: ``(stream, key, value)`` records, streams ``samples``, ``job-events``, ``node-events``,
``health``, the optional ``nic-samples`` (NodeNicSample: the link rules, findings out and
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
from peerwatch.schemas.records import StragglerFinding
from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.hard_watch import HardWatch
from peerwatch.streams.core.job_stage import JobReleaser, Release
from peerwatch.streams.core.model import InvalidRecordError
from peerwatch.streams.core.network_jobs import JobNetwork, JobPorts
from peerwatch.streams.core.network_stage import NetworkStage
from peerwatch.streams.core.policy_stage import PolicyStage
from peerwatch.streams.core.sample_stage import Census, SampleStage, StepResult
from peerwatch.streams.core.settings import StageSettings
from peerwatch.streams.core.silence import SilenceWatch
from peerwatch.streams.core.topology import Topology, live_topology
from peerwatch.streams.core.windows import SAMPLE_SPEC, ClosedWindows, WindowAggregator

WINDOW = "window"
FINDING = "finding"
RECOMMENDATION = "recommendation"
LATE_SAMPLE = "late_sample"
INVALID = "invalid"
_FAR_FUTURE_MS = 1 << 62
#: Most sample records handed to stage 2 between two drains (larger values measured no
#: faster, docs/performance.md).
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


class Pipeline:
    """The four stages in one process (see the module docstring)."""

    def __init__(
        self,
        settings: StageSettings,
        emit_windows: bool = True,
        max_batch: int = MAX_BATCH,
        topology: Topology | None = None,
    ) -> None:
        """``settings``: the live worker's settings objects (the tree's ``[stream]``,
        ``[detector]``, ``[network]`` and ``[policy]`` tables; :class:`peerwatch.settings.Settings`
        is one). ``emit_windows``: yield every scored GpuWindow (WINDOW outputs); a replay that
        keeps only findings and recommendations turns it off. ``max_batch``: most sample
        records handed to stage 2 between two drains. ``topology``: the leaf switches, for the
        network's switch grouping (None: ``network.topology``'s, as a live worker reads it at
        start). Raises ConfigError when ``network.topology`` names a file that cannot be read."""
        self.settings = settings
        self.max_batch = max_batch
        self.emit_windows = emit_windows
        stream = settings.stream
        if topology is None:
            topology = live_topology(settings.network.topology)
        self.stage = SampleStage(settings, topology=topology)
        self.jobs = JobReleaser(
            settings.detector,
            self.stage.allocations,
            grace_ms=int(stream.job_grace_s * 1000),
            fan_out_job_wide=stream.fan_out_job_wide,
            scored_windows=emit_windows,
        )
        self.policy = PolicyStage(settings.policy)
        # Stage 3's side of the network: each job's ports compared at its window's release.
        self.net_jobs = JobNetwork(settings.network, settings.detector)
        self.step_times = 0
        self._batch: list[Mapping[str, Any]] = []
        self._pending = 0  # samples handed to stage 2 since the last drain
        self._refused: list[tuple[str, dict[str, Any]]] = []  # their late and invalid ones
        self._closed: list[ClosedWindows] = []  # the windows they closed, with censuses
        self._censuses: list[Census] = []
        self._ports: list[JobPorts] = []  # and their jobs' ports, switch findings
        self._switches: list[StragglerFinding] = []
        self._pruned_ms: int | None = None  # stage 2 pruned at this watermark since the drain
        self._max_sample_ms = -_FAR_FUTURE_MS
        self._stream_ms = -_FAR_FUTURE_MS

    # stage 2's parts, by the names callers and tests know
    @property
    def allocations(self) -> AllocationTable:
        return self.stage.allocations

    @property
    def aggregator(self) -> WindowAggregator:
        return self.stage.aggregator(0)

    @property
    def hard(self) -> HardWatch:
        return self.stage.hard(0)

    @property
    def silence(self) -> SilenceWatch:
        return self.stage.silence

    @property
    def network(self) -> NetworkStage:
        return self.stage.network

    # -- the source -----------------------------------------------------------------------------
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
            if ts >= self.stage.due_ms() or len(self._batch) + self._pending >= self.max_batch:
                close_at = self.stage.next_close_ms()
                return self._part_done(self._flush_batch(), ts, close_at)
            return []
        if stream == "nic-samples":
            # The GPU samples before it first (their hard rules), so findings keep event order.
            out = self._flush_batch()
            found = self.stage.add_nic([value])
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
                self.stage.apply_job_event(value)
            elif stream in ("node-events", "health", "health-results"):
                out += self._recommend(value)
        except InvalidRecordError as exc:
            out.append(self._invalid(stream, key, value, exc))
        return out

    def feed_columns(self, tables: Mapping[str, Table]) -> list[Output]:
        """A run of samples as columns (:data:`~peerwatch.streams.core.windows.SAMPLE_SPEC`,
        string codes of ``aggregator.strings``), in replay order: the same outputs, at the same
        points, as feeding them one by one to :meth:`feed`."""
        out = self._drain() if self._batch else []
        n = tables[""].n
        ts = tables[""].values["ts_ms"]
        start = 0
        while start < n:
            end = min(n, start + self.max_batch - self._pending)
            # the first sample at or past the stage's next close (or silence check) ends the
            # part (it is in it)
            hits = np.flatnonzero(ts[start:end] >= self.stage.due_ms())
            if hits.size:
                end = start + int(hits[0]) + 1
            part = slice_rows(tables, start, end)
            close_at = self.stage.next_close_ms()
            out += self._part(part, functools.partial(self._sample_of, part))
            start = end
            out = self._part_done(out, int(ts[end - 1]), close_at)
        return out

    def finish(self) -> list[Output]:
        """End of input: close every open window and release every held job window."""
        out = self._drain()
        closed, censuses, ports, switches = self.stage.finish()
        return out + self._detect(closed, censuses, ports, switches, _FAR_FUTURE_MS)

    # -- stage 2 --------------------------------------------------------------------------------
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
        """One part of the samples through stage 2: its findings on arrival out now, its late
        and invalid samples, closed windows and censuses kept for the next drain."""
        result = self.stage.step(tables)
        self._pending += tables[""].n
        self._took(result, sample_of)
        if result.newest_ms is not None:
            self._max_sample_ms = max(self._max_sample_ms, result.newest_ms)
        found = result.hard
        return self._hot([(f, int(f["detected_ms"] or 0)) for f in found]) if found else []

    def _took(self, result: StepResult, sample_of: Callable[[int], dict[str, Any]]) -> None:
        """Keep what a step made for stage 3 until the next drain."""
        for kind, rows in ((LATE_SAMPLE, result.late), (INVALID, result.invalid)):
            self._refused += [(kind, sample_of(r)) for r in rows.tolist()]
        self._closed += result.closed
        self._censuses += result.censuses
        self._ports += result.ports
        self._switches += result.switches
        if result.pruned_ms is not None:
            self._pruned_ms = result.pruned_ms

    def _part_done(self, out: list[Output], last_ts_ms: int, close_at_ms: int) -> list[Output]:
        """After a part ending with a sample at ``last_ts_ms``: a drain when it closed windows
        (it reached ``close_at_ms``, the stage's next close before it) or filled a batch, then
        the silence checks when due."""
        if last_ts_ms >= close_at_ms or self._pending >= self.max_batch:
            out += self._drain()
        if self._max_sample_ms >= self.stage.next_silence_ms:
            for now in self.stage.silence_due():
                found = self.stage.check_silence(now)
                out += self._hot([(f, now) for f in found]) if found else []
        return out

    def _sample_of(self, tables: Mapping[str, Table], row: int) -> dict[str, Any]:
        """What a late or invalid sample of a column batch is reported as: node and time."""
        top = tables[""]
        return {
            "node": self.aggregator.name(int(top.values["node"][row])),
            "ts_ms": int(top.values["ts_ms"][row]),
        }

    # -- the channel to stage 3 -----------------------------------------------------------------
    def _drain(self) -> list[Output]:
        """Hand what stage 2 made since the last drain on: late and invalid samples out, the
        closed windows to stage 3, which releases what the watermark completes."""
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
        """After a drain's late samples: the windows closed, detected at the watermark."""
        agg = self.aggregator
        if agg.max_ts_ms is not None:
            self._stream_ms = max(self._stream_ms, agg.max_ts_ms)
        watermark = agg.watermark_ms
        if watermark is None:
            return out
        closed, censuses, ports, switches = (
            self._closed,
            self._censuses,
            self._ports,
            self._switches,
        )
        self._closed, self._censuses, self._ports, self._switches = [], [], [], []
        out += self._detect(closed, censuses, ports, switches, watermark)
        self._prune_jobs()
        return out

    def _prune_jobs(self) -> None:
        """Stage 3's state pruned where stage 2 pruned its own (once a minute of event time)."""
        if self._pruned_ms is not None:
            retention_ms = self.settings.stream.allocation_retention_s * 1000
            self.jobs.prune(self._pruned_ms, retention_ms)
            self.net_jobs.prune(self._pruned_ms - retention_ms)
            self._pruned_ms = None

    # -- stages 3 and 4 -------------------------------------------------------------------------
    def _detect(
        self,
        closed: list[ClosedWindows],
        censuses: list[Census],
        ports: list[JobPorts],
        switches: list[StragglerFinding],
        watermark_ms: int,
    ) -> list[Output]:
        """Stage 3 on closed windows: one source (every node), its watermark stage 2's. The
        fleet watch gets the windows' censuses (as live, where every samples partition sends
        its own), each job's ports go before its windows (as live), then the windows become
        dicts per job; the heartbeat judges the fleet first (a window of a partition in a fleet
        shift gets its ratio when released). The switch findings go out first."""
        for start, end, seen in censuses:
            self.jobs.census(0, start, end, seen)
        for jp in ports:
            self.net_jobs.add(jp)
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
            scored = r.result.scored
            if scored is not None:  # scored in place: the aggregator made them for this use only
                out += [
                    Output(WINDOW, job_id, cast(dict[str, Any], w), self._stream_ms)
                    for w in scored.in_place()
                ]
            for f, copies in zip(r.result.findings, r.to_nodes, strict=True):
                out.append(Output(FINDING, job_id, dict(f), self._stream_ms))
                for copy in copies:
                    out += self._recommend(copy)
            out += self._network_window(r)
        switched = [Output(FINDING, str(f["job_id"]), dict(f), self._stream_ms) for f in switches]
        return switched + out + fleet

    def _network_window(self, r: Release) -> list[Output]:
        """The job's network compared across its nodes at a released window (findings out and
        through the policy: each names a node and a port, no GPU)."""
        job_id, res = r.context.job_id, r.result
        end_ms = r.window_start_ms + self.settings.detector.window_ms
        found = self.net_jobs.release(
            job_id, r.window_start_ms, end_ms, res.job_wide, res.job_sm, res.job_step_ms
        )
        out: list[Output] = []
        for f in found:
            out.append(Output(FINDING, job_id, dict(f), self._stream_ms))
            out += self._recommend(f)
        return out

    def _hot(self, found: list[tuple[StragglerFinding, int]]) -> list[Output]:
        """Findings made on arrival (hard rules, silence, link rules), each with the event time
        a live worker publishes it at: out as findings, and through the policy."""
        out: list[Output] = []
        for f, stream_ms in found:
            out.append(Output(FINDING, str(f["job_id"]), dict(f), stream_ms))
            if f.get("node") is not None:
                out += self._recommend(f, stream_ms)
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
        """Stage 2's counters, the fleet watch's, the job network comparison's findings and the
        step-time records seen."""
        return {
            **self.stage.counters(),
            **self.jobs.fleet().counters(),
            "network_peer_findings": self.net_jobs.peers.findings,
            "step_times": self.step_times,
        }


def run_records(
    records: Iterable[tuple[str, str, Mapping[str, Any]]], settings: StageSettings
) -> list[Output]:
    """Convenience: run a fresh :class:`Pipeline` over ``records`` and return every output."""
    return list(Pipeline(settings).run(records))
