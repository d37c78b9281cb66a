"""The offline driver: allocation -> windows -> per-job detection -> drain policy, in one process.

The same four stages run in the live stream (keyed by node, job, node) and in replay; here they
are composed in one process for replay of a Kafka range or an archive, for the simulator and for
the evaluation harness. Each stage is a separable object with serialisable state:

1. :class:`~peerwatch.streams.core.allocation.AllocationTable` (JobEvents; keyed by node live);
2. :class:`~peerwatch.streams.core.windows.WindowAggregator` (sample batches; keyed by node);
3. :class:`JobStage` (a job's windows from all its nodes -> ``detect_job_window``; keyed by job);
4. :class:`PolicyStage` (findings, health results, node events -> ``policy.apply``; by node).

Input: ``(stream, key, value)`` records in roughly event-time order, streams ``samples``,
``job-events``, ``node-events``, ``health`` and the optional ``step-times`` (per-rank step
durations: a GPU's window gets the mean ``step_ms`` of its steps in that window, see
:meth:`JobStage.add_step`; without them the step feature is simply not compared).
Output: :class:`Output` records. Deterministic: the same input gives the same output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.detector import DetectionResult, detect_job_window
from peerwatch.streams.core.detector_state import JobDetectorState
from peerwatch.streams.core.model import JOB_WIDE, InvalidRecordError, JobContext
from peerwatch.streams.core.policy import apply as policy_apply
from peerwatch.streams.core.policy_state import DrainPolicyState
from peerwatch.streams.core.settings import DetectorSettings, PolicySettings, StreamSettings
from peerwatch.streams.core.windows import JobWindowBatch, WindowAggregator

WINDOW = "window"
FINDING = "finding"
RECOMMENDATION = "recommendation"
LATE_SAMPLE = "late_sample"
INVALID = "invalid"
_FAR_FUTURE_MS = 1 << 62
#: Allocations and detector states are pruned at most this often (in event time); both are
#: kept for an hour after their end, so a minute more changes nothing.
PRUNE_EVERY_MS = 60_000
#: The tree's ``[stream]`` defaults, the defaults of :class:`PipelineSettings`.
_STREAM = StreamSettings()


@dataclass(frozen=True)
class PipelineSettings:
    """Settings of the composed pipeline; the window length is ``detector.window_s``.

    ``lateness_s``, ``job_grace_s``, ``fan_out_job_wide``, ``allocation_retention_s``: as the
    tree's ``[stream]`` table, whose defaults they take (so the defaults replay what the live
    worker does; see :class:`~peerwatch.streams.core.settings.StreamSettings`).
    ``max_batch``: most sample records handed to the aggregator at once (offline only).
    """

    detector: DetectorSettings = field(default_factory=DetectorSettings)
    policy: PolicySettings = field(default_factory=PolicySettings)
    lateness_s: float = _STREAM.lateness_s
    job_grace_s: float = _STREAM.job_grace_s
    fan_out_job_wide: bool = _STREAM.fan_out_job_wide
    allocation_retention_s: int = _STREAM.allocation_retention_s
    max_batch: int = 1024


@dataclass(frozen=True)
class Output:
    """One output record. ``kind``: window, finding, recommendation, late_sample, invalid.

    ``stream_ms`` is the highest sample time the pipeline had seen when it produced the record:
    the event-time moment a live deployment would have published it (used for latencies).
    """

    kind: str
    key: str
    value: dict[str, Any]
    stream_ms: int


class JobStage:
    """Stage 3: gather a job's windows from all its nodes, run the detector in window order.

    A window is released when every expected GPU reported, or when ``watermark >= end +
    grace``; a complete window still waits for older incomplete ones of the same job, because
    the detector needs increasing window starts.
    """

    def __init__(self, settings: DetectorSettings, grace_ms: int = 0) -> None:
        self.settings = settings
        self.grace_ms = grace_ms
        self.pending: dict[str, dict[int, dict[tuple[str, int], dict[str, Any]]]] = {}
        self.states: dict[str, JobDetectorState] = {}
        #: job -> start of the newest window released (older batches are dropped).
        self.released: dict[str, int] = {}
        self.dropped = 0
        #: job -> window start -> (node, GPU index) -> [sum of step ms, steps] (StepTime).
        self.steps: dict[str, dict[int, dict[tuple[str, int], list[float]]]] = {}
        self.steps_late = 0

    def add(self, batch: JobWindowBatch) -> bool:
        """Hold the windows of ``batch`` (one job, one window, some nodes). A batch for a window
        the job already released (a hot-stage restart re-sending it) is dropped: False."""
        if batch.window_start_ms <= self.released.get(batch.job_id, -(1 << 62)):
            self.dropped += 1
            return False
        slot = self.pending.setdefault(batch.job_id, {}).setdefault(batch.window_start_ms, {})
        for w in batch.windows:
            slot[(str(w["node"]), int(w["gpu_index"]))] = w
        return True

    def add_step(self, record: Mapping[str, Any]) -> bool:
        """Hold one StepTime for the window of its ``ts_ms``; its GPU's window then gets the
        mean ``step_ms`` of the window's steps, compared across peers like the other features.
        False (not used) without a GPU index, or when the job already released that window."""
        gpu, job_id = record.get("gpu_index"), str(record.get("job_id"))
        ts, duration = record.get("ts_ms"), record.get("step_duration_ms")
        if gpu is None or not isinstance(ts, int) or not isinstance(duration, int | float):
            return False
        wms = self.settings.window_ms
        start = ts - ts % wms
        if start <= self.released.get(job_id, -(1 << 62)):
            self.steps_late += 1
            return False
        slot = self.steps.setdefault(job_id, {}).setdefault(start, {})
        acc = slot.setdefault((str(record.get("node")), int(gpu)), [0.0, 0])
        acc[0] += float(duration)
        acc[1] += 1
        return True

    def _with_steps(self, job_id: str, start: int, windows: list[dict[str, Any]]) -> None:
        starts = self.steps.get(job_id)
        if not starts:
            return
        for old in [s for s in starts if s < start]:
            del starts[old]  # windows released without their own samples
        got = starts.pop(start, None)
        if not starts:
            del self.steps[job_id]
        if got:
            for w in windows:
                acc = got.get((str(w["node"]), int(w["gpu_index"])))
                if acc and acc[1]:
                    w["step_ms"] = acc[0] / acc[1]

    def release(
        self, watermark_ms: int, context_of: Callable[[str], JobContext]
    ) -> list[tuple[JobContext, DetectionResult]]:
        """Run the detector on every releasable window; returns (context, result) pairs in
        (job id, window start) order. Raises InvalidRecordError from the detector."""
        out: list[tuple[JobContext, DetectionResult]] = []
        wms = self.settings.window_ms
        for job_id in sorted(self.pending):
            starts = self.pending[job_id]
            ctx = context_of(job_id)
            while starts:
                start = min(starts)
                have = starts[start]
                complete = ctx.expected_gpus is not None and len(have) >= ctx.expected_gpus
                if not complete and start + wms + self.grace_ms > watermark_ms:
                    break
                del starts[start]
                self.released[job_id] = max(self.released.get(job_id, start), start)
                state = self.states.get(job_id)
                if state is None:
                    state = self.states[job_id] = JobDetectorState(job_id=job_id)
                windows = [have[k] for k in sorted(have)]
                self._with_steps(job_id, start, windows)
                out.append((ctx, detect_job_window(ctx, windows, state, self.settings)))
            if not starts:
                del self.pending[job_id]
        return out

    def prune(self, watermark_ms: int, idle_ms: int) -> None:
        """Forget detector states of jobs with no window for ``idle_ms`` (ended jobs), and step
        times that no window claimed for as long."""
        for job_id, starts in list(self.steps.items()):
            for start in [s for s in starts if s + idle_ms < watermark_ms]:
                del starts[start]
            if not starts:
                del self.steps[job_id]
        for job_id, state in list(self.states.items()):
            last = state.last_window_start_ms
            if job_id not in self.pending and last is not None and last + idle_ms < watermark_ms:
                del self.states[job_id]

    def to_dict(self) -> dict[str, Any]:
        return {
            "pending": {
                j: {str(s): list(ws.values()) for s, ws in sorted(starts.items())}
                for j, starts in sorted(self.pending.items())
            },
            "states": {j: s.to_dict() for j, s in sorted(self.states.items())},
        }

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], settings: DetectorSettings, grace_ms: int = 0
    ) -> JobStage:
        out = cls(settings, grace_ms)
        for job_id, starts in (data.get("pending") or {}).items():
            for start, windows in starts.items():
                out.add(
                    JobWindowBatch(job_id, int(start), int(start) + settings.window_ms, windows)
                )
        out.states = {
            j: JobDetectorState.from_dict(s) for j, s in (data.get("states") or {}).items()
        }
        return out


class PolicyStage:
    """Stage 4: the drain policy over findings, health results and node events."""

    def __init__(self, settings: PolicySettings, fan_out_job_wide: bool = False) -> None:
        self.settings = settings
        self.fan_out_job_wide = fan_out_job_wide
        self.state = DrainPolicyState()

    def apply(
        self, record: Mapping[str, Any], job_nodes: Iterable[str] = ()
    ) -> list[dict[str, Any]]:
        """Recommendations for one record; a JOB_WIDE finding goes to each of ``job_nodes``
        when fan-out is on. Raises InvalidRecordError for a record the policy rejects."""
        if (
            self.fan_out_job_wide
            and record.get("status") == JOB_WIDE
            and record.get("node") is None
        ):
            out: list[dict[str, Any]] = []
            for node in sorted(job_nodes):
                out += policy_apply({**record, "node": node}, self.state, self.settings)
            return out
        return policy_apply(record, self.state, self.settings)


class Pipeline:
    """All four stages in one process (see the module docstring)."""

    def __init__(self, settings: PipelineSettings | None = None) -> None:
        self.settings = settings = settings or PipelineSettings()
        self.allocations = AllocationTable(settings.allocation_retention_s * 1000)
        self.aggregator = WindowAggregator(
            self.allocations, settings.detector.window_s, settings.lateness_s, idle_jobs=True
        )
        self.jobs = JobStage(settings.detector, int(settings.job_grace_s * 1000))
        self.policy = PolicyStage(settings.policy, settings.fan_out_job_wide)
        self.step_times = 0
        self._batch: list[Mapping[str, Any]] = []
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
            # Close as soon as a sample moves the watermark past a window end, so outputs come
            # out at the event time a live stream would publish them.
            if ts >= self._next_close_ms or len(self._batch) >= self.settings.max_batch:
                return self._drain()
            return []
        if stream == "step-times":
            self.step_times += 1
            self.jobs.add_step(value)
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
                out += self._recommend(value, ())
        except InvalidRecordError as exc:
            out.append(self._invalid(stream, key, value, exc))
        return out

    def finish(self) -> list[Output]:
        """End of input: close every open window and release every held job window."""
        out = self._drain()
        out += self._detect(self.aggregator.flush(), _FAR_FUTURE_MS)
        return out

    # -- stages ---------------------------------------------------------------------------------
    def _drain(self) -> list[Output]:
        if not self._batch:
            return []
        batch, self._batch = self._batch, []
        late = self.aggregator.add_batch(batch)
        return self._after_batch(late)

    def _after_batch(self, late: list[Mapping[str, Any]]) -> list[Output]:
        """After a batch went through the aggregator: late samples out, windows closed and
        detected, state pruned."""
        out = [Output(LATE_SAMPLE, str(s.get("node")), dict(s), self._stream_ms) for s in late]
        if self.aggregator.max_ts_ms is not None:
            self._stream_ms = max(self._stream_ms, self.aggregator.max_ts_ms)
        watermark = self.aggregator.watermark_ms
        if watermark is None:
            return out
        out += self._detect(self.aggregator.close_ready(watermark), watermark)
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
        self.jobs.prune(watermark_ms, self.settings.allocation_retention_s * 1000)

    def _allocations_changed(self) -> None:
        """Hook: the allocation table changed (events applied or pruned)."""

    def _context(self, job_id: str) -> JobContext:
        meta = self.allocations.job(job_id)
        return meta.context() if meta is not None else JobContext(job_id=job_id)

    def _detect(self, batches: list[JobWindowBatch], watermark_ms: int) -> list[Output]:
        out: list[Output] = []
        for b in batches:
            self.jobs.add(b)
        try:
            results = self.jobs.release(watermark_ms, self._context)
        except InvalidRecordError as exc:  # pragma: no cover - the aggregator builds valid windows
            return [self._invalid("job-windows", "", {}, exc)]
        for ctx, result in results:
            for w in result.windows:
                out.append(Output(WINDOW, ctx.job_id, w, self._stream_ms))
            for f in result.findings:
                out.append(Output(FINDING, ctx.job_id, f, self._stream_ms))
                out += self._recommend(f, self.allocations.nodes_of(ctx.job_id))
        return out

    def _recommend(self, record: Mapping[str, Any], job_nodes: Iterable[str]) -> list[Output]:
        try:
            recs = self.policy.apply(record, job_nodes)
        except InvalidRecordError as exc:
            return [self._invalid("policy", str(record.get("node")), record, exc)]
        return [Output(RECOMMENDATION, r["node"], r, self._stream_ms) for r in recs]

    def _invalid(self, stream: str, key: str, value: Mapping[str, Any], exc: Exception) -> Output:
        return Output(
            INVALID,
            key,
            {"stream": stream, "error": str(exc), "record": dict(value)},
            self._stream_ms,
        )

    def counters(self) -> dict[str, int]:
        """The aggregator's counters plus step-time records seen."""
        return {**self.aggregator.counters(), "step_times": self.step_times}


def run_records(
    records: Iterable[tuple[str, str, Mapping[str, Any]]], settings: PipelineSettings | None = None
) -> list[Output]:
    """Convenience: run a fresh :class:`Pipeline` over ``records`` and return every output."""
    return list(Pipeline(settings).run(records))
