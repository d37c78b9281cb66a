"""Stage 3 (keyed by job): a job's windows from all its nodes, released to the detector in window
order, and its findings routed on to stage 4 (keyed by node).

Pure code with two drivers: the live faust agent (:mod:`peerwatch.streams.live.app`: decode,
call, produce, write the changelog tables) and the offline
:class:`~peerwatch.streams.core.pipeline.Pipeline` (one source, one channel).

* :class:`JobStage` holds the pending windows, step times and detector states, and releases a
  job's windows at a given watermark.
* :class:`JobReleaser` is the release logic around it: per-source watermarks (a job waits for
  the slowest samples partition holding one of its nodes), the pending entries each release
  retires (the live driver deletes them from its changelog table), recovery of a job from such
  a table, and the routing of findings to nodes (:func:`route_finding`).

Words: a *source* is a samples partition, one hot-stage aggregator, which sends window batches
and then heartbeats ``closed_until_ms``; a *channel* is the stage-3 partition they arrive on. The
hot stage sends a copy of each heartbeat on every channel, and a copy is ordered only after the
batches of its own channel, so watermarks are kept per channel: another channel's copy may be
consumed before this channel's batches and would release them early. The fleet watch judges on
channel :data:`~peerwatch.streams.core.fleet.FLEET_CHANNEL` only; the other channels release by
its verdicts (:meth:`JobReleaser.verdict`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from operator import itemgetter
from typing import Any, NamedTuple, Protocol, cast

from peerwatch.schemas.records import GpuWindow, StragglerFinding
from peerwatch.streams.core.allocation import JobMeta
from peerwatch.streams.core.detector import DetectionResult, ScoredWindows, detect_job_window
from peerwatch.streams.core.detector_state import JobDetectorState
from peerwatch.streams.core.fleet import (
    FLEET_CHANNEL,
    FleetVerdicts,
    FleetWatch,
    SourceCensus,
    set_ratios,
)
from peerwatch.streams.core.model import JOB_WIDE, InvalidRecordError, JobContext
from peerwatch.streams.core.settings import DetectorSettings
from peerwatch.streams.core.window_columns import WindowColumns
from peerwatch.streams.core.window_dicts import LazyWindows
from peerwatch.streams.core.windows import ColumnsBatch, JobWindowBatch, merge_closed

#: A window batch stage 3 holds: the aggregator's (replay) or as columns (from the hot stage).
HeldBatch = JobWindowBatch | ColumnsBatch
#: A watermark before any event time (a source not heard from yet).
NEVER_MS = -(1 << 62)
#: No fleet watch to wait for.
_NO_LIMIT = 1 << 62
_NODE, _GPU_INDEX = itemgetter("node"), itemgetter("gpu_index")

#: The longest step duration taken, ms (one day): a longer one is a unit mix-up or a broken
#: clock, and 1e308 (or +inf) beside peers of a second would flag a healthy GPU.
STEP_MS_MAX = 86_400_000.0


def step_duration_ms(record: Mapping[str, Any]) -> float:
    """A StepTime's ``step_duration_ms``, checked: a finite number in ``[0, STEP_MS_MAX]``
    ms. Live and replay take step times through :meth:`JobStage.add_step` only, so both refuse
    the same records. Raises InvalidRecordError (the driver dead-letters and counts it)."""
    duration = record.get("step_duration_ms")
    if isinstance(duration, bool) or not isinstance(duration, int | float):
        raise InvalidRecordError(f"step_duration_ms is not a number: {duration!r}")
    if not 0.0 <= duration <= STEP_MS_MAX:  # NaN fails both comparisons
        raise InvalidRecordError(f"step_duration_ms {duration!r} outside [0, {STEP_MS_MAX:.0f}] ms")
    return float(duration)


class JobStage:
    """Gather a job's windows from all its nodes, run the detector in window order.

    A window is released when every expected GPU reported, or when ``watermark >= end +
    grace``; a complete window still waits for older incomplete ones of the same job, because
    the detector needs increasing window starts. Released windows come with their scores
    (``result.scored``: the windows untouched, see :func:`detect_job_window`'s ``"values"``);
    ``scored_windows``: False when no scored window is published (results then hold findings
    only).

    A window's batches held as the aggregator made them (its columns, each GPU once) stay so,
    several sources' batches side by side, and are merged as columns when released
    (:func:`~peerwatch.streams.core.windows.merge_closed`); a batch of dicts, or a GPU given
    twice (a re-sent batch: the later window stands), keys the window's dicts by GPU instead.
    """

    def __init__(
        self, settings: DetectorSettings, grace_ms: int = 0, scored_windows: bool = True
    ) -> None:
        self.settings = settings
        self.grace_ms = grace_ms
        self.scored_windows = scored_windows
        self.pending: dict[str, dict[int, dict[tuple[str, int], dict[str, Any]]]] = {}
        self.states: dict[str, JobDetectorState] = {}
        #: job -> start of the newest window released (older batches are dropped).
        self.released: dict[str, int] = {}
        self.dropped = 0
        #: job -> window start -> (node, GPU index) -> [sum of step ms, steps] (StepTime).
        self.steps: dict[str, dict[int, dict[tuple[str, int], list[float]]]] = {}
        self.steps_late = 0
        #: (job, window start) -> the batches held for it as they came with their columns (the
        #: aggregator's: released as they are, merged, the detector reading their columns)
        self.whole: dict[tuple[str, int], list[HeldBatch]] = {}
        #: (job, window start) -> the GPU keys of its batches in ``whole`` (when several)
        self._whole_keys: dict[tuple[str, int], set[str]] = {}

    def add(self, batch: HeldBatch) -> bool:
        """Hold the windows of ``batch`` (one job, one window, some nodes). A batch for a window
        the job already released (a hot-stage restart re-sending it) is dropped: False."""
        if batch.window_start_ms <= self.released.get(batch.job_id, NEVER_MS):
            self.dropped += 1
            return False
        starts = self.pending.setdefault(batch.job_id, {})
        at = (batch.job_id, batch.window_start_ms)
        slot = starts.get(batch.window_start_ms)
        if slot is None:
            slot = starts[batch.window_start_ms] = {}
            if _whole(batch):  # each GPU once: held whole
                self.whole[at] = [batch]
                return True
        elif at in self.whole and _mergeable(batch) and _mergeable(self.whole[at][0]):
            held = self.whole[at]
            seen = self._whole_keys.get(at)
            if seen is None:
                seen = self._whole_keys[at] = set(_keys(held[0]))
            keys = _keys(batch)
            if seen.isdisjoint(keys) and len(set(keys)) == len(keys):
                seen.update(keys)
                held.append(batch)
                return True
        self._slot(batch.job_id, batch.window_start_ms)
        _fill(slot, _windows(batch))
        return True

    def _held(self, job_id: str, start: int) -> list[dict[str, Any]]:
        """The held windows of a job's window, one per GPU (as :meth:`_slot` would key them)."""
        whole = self.whole.get((job_id, start))
        if whole is None:
            return list(self.pending[job_id][start].values())
        keyed: dict[tuple[str, int], dict[str, Any]] = {}
        for batch in whole:
            _fill(keyed, _windows(batch))
        return list(keyed.values())

    def _slot(self, job_id: str, start: int) -> dict[tuple[str, int], dict[str, Any]]:
        """The held windows of a job's window by GPU (those of a batch held whole keyed now)."""
        slot = self.pending[job_id][start]
        self._whole_keys.pop((job_id, start), None)
        for batch in self.whole.pop((job_id, start), ()):
            _fill(slot, _windows(batch))
        return slot

    def add_step(self, record: Mapping[str, Any]) -> bool:
        """Hold one StepTime for the window of its ``ts_ms``; its GPU's window then gets the
        mean ``step_ms`` of the window's steps, compared across peers like the other features.
        False (not used) without a GPU index, or when the job already released that window.
        Raises InvalidRecordError for a duration :func:`step_duration_ms` refuses (non-finite,
        negative, absurd): it never reaches the peer comparison."""
        duration = step_duration_ms(record)
        gpu, job_id, ts = record.get("gpu_index"), str(record.get("job_id")), record.get("ts_ms")
        if gpu is None or not isinstance(ts, int):
            return False
        wms = self.settings.window_ms
        start = ts - ts % wms
        if start <= self.released.get(job_id, NEVER_MS):
            self.steps_late += 1
            return False
        slot = self.steps.setdefault(job_id, {}).setdefault(start, {})
        acc = slot.setdefault((str(record.get("node")), int(gpu)), [0.0, 0])
        acc[0] += duration
        acc[1] += 1
        return True

    def _with_steps(self, job_id: str, start: int, windows: Sequence[dict[str, Any]]) -> bool:
        """Give the windows their ``step_ms``; whether any got one."""
        starts = self.steps.get(job_id)
        if not starts:
            return False
        for old in [s for s in starts if s < start]:
            del starts[old]  # windows released without their own samples
        got = starts.pop(start, None)
        if not starts:
            del self.steps[job_id]
        changed = False
        if got:
            for w in windows:
                acc = got.get((str(w["node"]), int(w["gpu_index"])))
                if acc and acc[1]:
                    w["step_ms"] = acc[0] / acc[1]
                    changed = True
        return changed

    def release(
        self, watermark_ms: int, context_of: Callable[[str], JobContext]
    ) -> list[tuple[JobContext, DetectionResult]]:
        """Run the detector on every releasable window; returns (context, result) pairs in
        (job id, window start) order. Raises InvalidRecordError from the detector."""
        out: list[tuple[JobContext, DetectionResult]] = []
        for job_id in sorted(self.pending):
            ctx = context_of(job_id)
            out += [(ctx, result) for _, result in self.release_job(job_id, watermark_ms, ctx)]
        return out

    def release_job(
        self,
        job_id: str,
        watermark_ms: int,
        ctx: JobContext,
        fleet: FleetWatch | FleetVerdicts | None = None,
    ) -> list[tuple[int, DetectionResult]]:
        """Run the detector on the releasable windows of one job; returns (window start,
        result) pairs in window order. With ``fleet``, a window waits until the fleet watch
        judged its start (complete or not) and gets its ``fleet_clk_ratio`` from it. Raises
        InvalidRecordError from the detector."""
        judged = _NO_LIMIT if fleet is None else fleet.judged_until_ms
        out: list[tuple[int, DetectionResult]] = []
        starts = self.pending.get(job_id)
        if starts is None:
            return out
        wms = self.settings.window_ms
        while starts:
            start = min(starts)
            whole = self.whole.get((job_id, start))
            have = starts[start]  # empty while batches are held whole
            count = sum(map(_count, whole)) if whole is not None else len(have)
            complete = ctx.expected_gpus is not None and count >= ctx.expected_gpus
            if not self._judged(start, judged):
                break  # the fleet watch has not judged the window start yet
            if not complete and start + wms + self.grace_ms > watermark_ms:
                break
            del starts[start]
            self.whole.pop((job_id, start), None)
            self._whole_keys.pop((job_id, start), None)
            self.released[job_id] = max(self.released.get(job_id, start), start)
            state = self.states.get(job_id)
            if state is None:
                state = self.states[job_id] = JobDetectorState(job_id=job_id)
            columns = None
            if whole is not None:  # the aggregator's batches, sorted by GPU, each GPU once
                windows, columns = _merged(whole)
            else:
                windows = [have[k] for k in sorted(have)]
            if fleet is not None:
                set_ratios(windows, fleet.ratios(start))
            # the aggregator's dicts are GpuWindow records (typed at the detector's door)
            typed = cast(list[GpuWindow], windows)
            if self._with_steps(job_id, start, windows) and columns is not None:
                columns.set_float("step_ms", typed)
            # scored as values beside the windows (a publisher encodes them from their columns)
            scored: ScoredWindows = "values" if self.scored_windows else "none"
            out.append(
                (start, detect_job_window(ctx, typed, state, self.settings, scored, columns))
            )
        if not starts:
            del self.pending[job_id]
        return out

    def oldest_judged(self, job_id: str, judged_until_ms: int | None) -> bool:
        """Whether the fleet watch judged the start of the job's oldest pending window
        (``judged_until_ms``: windows ending at or before it are judged; None: none is); False
        without a pending window. If not, :meth:`release_job` releases nothing now, whatever
        the job's context and watermark."""
        starts = self.pending.get(job_id)
        if not starts:
            return False
        return self._judged(min(starts), judged_until_ms)

    def _judged(self, start_ms: int, judged_until_ms: int | None) -> bool:
        return judged_until_ms is not None and start_ms + self.settings.window_ms <= judged_until_ms

    def prune(self, watermark_ms: int, idle_ms: int) -> None:
        """Forget detector states of jobs with no window for ``idle_ms`` (ended jobs), step
        times that no window claimed for as long, and the newest released window of a job
        forgotten so (a batch older still is later than any re-send)."""
        for job_id, starts in list(self.steps.items()):
            for start in [s for s in starts if s + idle_ms < watermark_ms]:
                del starts[start]
            if not starts:
                del self.steps[job_id]
        for job_id, state in list(self.states.items()):
            last = state.last_window_start_ms
            if job_id not in self.pending and last is not None and last + idle_ms < watermark_ms:
                del self.states[job_id]
        for job_id, start in list(self.released.items()):
            forgotten = job_id not in self.pending and job_id not in self.states
            if forgotten and start + idle_ms < watermark_ms:
                del self.released[job_id]

    def to_dict(self) -> dict[str, Any]:
        return {
            "pending": {
                j: {str(s): self._held(j, s) for s in sorted(starts)}
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


class JobDirectory(Protocol):
    """What stage 3 asks about jobs (an :class:`~peerwatch.streams.core.allocation.AllocationTable`)."""

    def job(self, job_id: str) -> JobMeta | None: ...

    def nodes_of(self, job_id: str) -> list[str]: ...


class PendingEntry(NamedTuple):
    """One window batch held for a job: (job, window start, source). The live driver keeps one
    changelog entry per pending batch under :attr:`key` (a 512-GPU job's whole state would not
    fit one Kafka message)."""

    job_id: str
    window_start_ms: int
    src: int

    @property
    def key(self) -> str:
        return f"{self.job_id}|{self.window_start_ms}|{self.src}"

    @classmethod
    def from_key(cls, key: str) -> PendingEntry:
        """The entry of a :attr:`key`; raises ValueError for another string."""
        job_id, start, src = key.rsplit("|", 2)
        return cls(job_id, int(start), int(src))


@dataclass(frozen=True)
class Release:
    """One window of one job, released: the detector's result and, per finding of
    ``result.findings`` (same order), the copies stage 4 gets, one per node
    (:func:`route_finding`)."""

    context: JobContext
    window_start_ms: int
    result: DetectionResult
    to_nodes: list[list[dict[str, Any]]]


@dataclass
class Released:
    """What one call released: ``releases`` in (job id, window start) order; ``retired``, the
    pending entries they consumed (to delete from a changelog); ``saved``, job -> the state to
    keep for each job that released (:meth:`JobReleaser.saved_state`, serialised only when read:
    read it before the next call; offline nobody does)."""

    releases: list[Release] = field(default_factory=list)
    retired: list[PendingEntry] = field(default_factory=list)
    saved: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    #: the channel's fleet watch's findings (FLEET_WIDE, CLEARED) judged by this call
    fleet: list[StragglerFinding] = field(default_factory=list)


class _SavedStates(Mapping[str, dict[str, Any]]):
    """Job -> :meth:`JobReleaser.saved_state`, computed when read."""

    def __init__(self, releaser: JobReleaser, jobs: list[str]) -> None:
        self._releaser, self._jobs = releaser, jobs

    def __getitem__(self, job_id: str) -> dict[str, Any]:
        if job_id not in self._jobs:
            raise KeyError(job_id)
        return self._releaser.saved_state(job_id)

    def __iter__(self) -> Iterator[str]:
        return iter(self._jobs)

    def __len__(self) -> int:
        return len(self._jobs)


def route_finding(
    finding: Mapping[str, Any], job_nodes: Callable[[], Iterable[str]], fan_out_job_wide: bool
) -> list[dict[str, Any]]:
    """The copies of ``finding`` for stage 4 (keyed by node): a node's finding goes to its node;
    a JOB_WIDE finding (no node) to every node of ``job_nodes()`` (sorted) when fanning out (one
    INFO alert per node); any other job-level finding to none (the policy has no node to act on)."""
    if finding.get("node") is not None:
        return [dict(finding)]
    if finding.get("status") == JOB_WIDE and fan_out_job_wide:
        return [{**finding, "node": node} for node in sorted(job_nodes())]
    return []


def batch_of_message(message: Mapping[str, Any]) -> tuple[JobWindowBatch, int]:
    """The window batch and source of a single-source stage 2 -> 3 message (``kind``
    ``windows`` with ``src`` and ``windows``). Raises KeyError, ValueError or TypeError for a
    malformed one."""
    batch = JobWindowBatch(
        str(message["job_id"]),
        int(message["window_start_ms"]),
        int(message["window_end_ms"]),
        list(message["windows"]),
    )
    return batch, int(message["src"])


def batches_of_message(message: Mapping[str, Any]) -> list[tuple[HeldBatch, list[int]]]:
    """The window batches and their sources of a stage 2 -> 3 message, as the hot stage sends
    it and the live driver keeps it in its pending table: one job and window, with ``batch``
    (its windows as the aggregator made them, of every source in ``sources``) and ``parts``
    (source -> its windows as dicts: older workers), or one ``src`` and its ``windows`` (older
    still). Raises KeyError, ValueError or TypeError for a malformed one."""
    if "parts" not in message:
        batch, src = batch_of_message(message)
        return [(batch, [src])]
    parts = message["parts"]
    whole = message.get("batch")
    if not isinstance(parts, Mapping) or not (parts or whole):
        raise ValueError("window batch without parts")
    job_id, start, end = (
        str(message["job_id"]), int(message["window_start_ms"]), int(message["window_end_ms"])
    )  # fmt: skip
    out: list[tuple[HeldBatch, list[int]]] = [
        (JobWindowBatch(job_id, start, end, list(ws)), [int(src)]) for src, ws in parts.items()
    ]
    if whole is not None:
        if not isinstance(whole, ColumnsBatch) or (
            whole.job_id,
            whole.window_start_ms,
            whole.window_end_ms,
        ) != (job_id, start, end):
            raise ValueError("window batch of another job or window than its message")
        out.insert(0, (whole, [int(src) for src in message["sources"]]))
    return out


class JobReleaser:
    """Stage 3's release logic over a :class:`JobStage` (see the module docstring).

    ``jobs``: job contexts and nodes (the allocation table). ``partition_of``: node -> the source
    holding it; None when every node is in one source (offline). ``fan_out_job_wide``: route a
    JOB_WIDE finding to every node of its job. ``scored_windows``: as :class:`JobStage`'s.
    ``fleet_sources``: how many sources the fleet watch waits for (the samples partitions;
    offline one); it judges on channel :data:`~peerwatch.streams.core.fleet.FLEET_CHANNEL`, the
    other channels hold its verdicts. Raises InvalidRecordError from the detector.

    Restart: a job's state and pending batches come back with :meth:`restore`; the watermarks
    do not (every source sends its next heartbeat soon), so a window may be released a
    heartbeat later than without the restart, never differently.
    """

    def __init__(
        self,
        settings: DetectorSettings,
        jobs: JobDirectory,
        *,
        grace_ms: int = 0,
        fan_out_job_wide: bool = False,
        partition_of: Callable[[str], int] | None = None,
        scored_windows: bool = True,
        fleet_sources: int = 1,
    ) -> None:
        self.stage = JobStage(settings, grace_ms, scored_windows)
        self.settings = settings
        #: samples partitions: the fleet watch judges a window start once all of them closed it
        self.fleet_sources = fleet_sources
        #: the fleet watch (channel FLEET_CHANNEL) and, per other channel, its verdicts there
        self.fleets: dict[int, FleetWatch | FleetVerdicts] = {}
        self.jobs = jobs
        self.fan_out_job_wide = fan_out_job_wide
        self.partition_of = partition_of
        #: channel -> source -> closed_until_ms.
        self.watermarks: dict[int, dict[int, int]] = {}
        #: job -> the channel its batches arrive on (its heartbeats release it).
        self.channel_of: dict[str, int] = {}
        #: (job, window start) -> sources of its pending batches.
        self.sources: dict[tuple[str, int], set[int]] = {}
        self._seen: set[str] = set()

    # -- input ----------------------------------------------------------------------------------
    def add(self, batch: HeldBatch, src: int | Iterable[int], channel: int = 0) -> bool:
        """Hold a window batch from source ``src`` (or sources: one batch of several);
        nothing is released (:meth:`release`). False when the job already released that window
        (a restarted hot stage re-sent it): the batch is dropped and there is nothing to
        keep."""
        self._seen.add(batch.job_id)
        self.channel_of[batch.job_id] = channel
        return self._hold(batch, [src] if isinstance(src, int) else src)

    def _hold(self, batch: HeldBatch, srcs: Iterable[int]) -> bool:
        if not self.stage.add(batch):
            return False
        self.sources.setdefault((batch.job_id, batch.window_start_ms), set()).update(srcs)
        return True

    def add_step(self, record: Mapping[str, Any]) -> bool:
        """One StepTime record (see :meth:`JobStage.add_step`)."""
        return self.stage.add_step(record)

    def fleet(self) -> FleetWatch:
        """The fleet watch (it judges on channel FLEET_CHANNEL)."""
        watch = self.decisions(FLEET_CHANNEL)
        assert isinstance(watch, FleetWatch)
        return watch

    def decisions(self, channel: int) -> FleetWatch | FleetVerdicts:
        """What releases the windows of ``channel``: the fleet watch on FLEET_CHANNEL, its
        verdicts on any other channel."""
        got = self.fleets.get(channel)
        if got is None:
            got = self.fleets[channel] = (
                FleetWatch(self.settings, self.fleet_sources)
                if channel == FLEET_CHANNEL
                else FleetVerdicts()
            )
        return got

    def census(self, src: int, start_ms: int, end_ms: int, seen: dict[str, SourceCensus]) -> None:
        """Source ``src``'s fleet censuses of one window start (see
        :meth:`~peerwatch.streams.core.fleet.FleetWatch.add`); judged at a heartbeat."""
        self.fleet().add(src, start_ms, end_ms, seen)

    def verdict(self, message: dict[str, Any], channel: int) -> Released:
        """The fleet watch's verdict (:meth:`~peerwatch.streams.core.fleet.FleetVerdicts.apply`)
        on ``channel`` (not FLEET_CHANNEL); releases what it lets go among the channel's jobs.
        Raises KeyError, ValueError or TypeError for a malformed message, ValueError for a
        verdict on FLEET_CHANNEL itself."""
        held = self.decisions(channel)
        if not isinstance(held, FleetVerdicts):
            raise ValueError(f"a fleet verdict on the judging channel {channel}")
        held.apply(message)
        return self.release(
            *sorted(j for j in self.stage.pending if self.channel_of.get(j) == channel)
        )

    def heartbeat(self, src: int, closed_until_ms: int, channel: int = 0) -> Released:
        """Source ``src`` closed every window ending at or before ``closed_until_ms`` (int ms);
        releases what that completes among the jobs of ``channel``. A source's watermark never
        goes back (an older heartbeat read again changes nothing)."""
        return self.heartbeats({src: closed_until_ms}, channel)

    def heartbeats(self, closed_until_ms: Mapping[int, int], channel: int = 0) -> Released:
        """:meth:`heartbeat` of several sources at once (source -> closed until, ms), one
        release at the end: the same windows released as by one heartbeat after another (a
        window waits for every source holding its nodes), fewer calls."""
        marks = self.watermarks.setdefault(channel, {})
        fleet = self.decisions(channel)
        for src, until in closed_until_ms.items():
            marks[src] = max(marks.get(src, until), until)
            if isinstance(fleet, FleetWatch):
                fleet.closed(src, until)
        found = fleet.judge() if isinstance(fleet, FleetWatch) else []
        jobs = [j for j in self.stage.pending if self.channel_of.get(j) == channel]
        out = self.release(*sorted(jobs))
        out.fleet = found
        return out

    def release(self, *job_ids: str) -> Released:
        """Release what is complete or past its watermark for ``job_ids`` (in that order).

        A job whose oldest window the fleet watch has not judged is passed over before its
        context and watermark (a walk over its nodes' sources) are made: at most heartbeats and
        verdicts that is nearly every pending job of the channel, and nothing of it releases."""
        out = Released()
        saved_jobs: list[str] = []
        judged: dict[int, int | None] = {}  # channel -> how far its fleet judged (this call)
        for job_id in job_ids:
            channel = self.channel_of.get(job_id, FLEET_CHANNEL)
            fleet = self.decisions(channel)
            if channel not in judged:  # the fleet watch's is a minimum over every source
                judged[channel] = fleet.judged_until_ms
            if not self.stage.oldest_judged(job_id, judged[channel]):
                continue
            meta = self.jobs.job(job_id)
            ctx = meta.context() if meta is not None else JobContext(job_id=job_id)
            got = self.stage.release_job(job_id, self.watermark_ms(job_id), ctx, fleet)
            for start, result in got:
                out.releases.append(Release(ctx, start, result, self._routes(job_id, result)))
                srcs = self.sources.pop((job_id, start), ())
                out.retired += [PendingEntry(job_id, start, src) for src in sorted(srcs)]
            if got:
                saved_jobs.append(job_id)
        out.saved = _SavedStates(self, saved_jobs)
        return out

    def _routes(self, job_id: str, result: DetectionResult) -> list[list[dict[str, Any]]]:
        nodes = partial(self.jobs.nodes_of, job_id)  # asked only for a JOB_WIDE finding
        return [route_finding(f, nodes, self.fan_out_job_wide) for f in result.findings]

    def low_watermark_ms(self) -> int | None:
        """The slowest watermark of every source heard from (None before the first heartbeat):
        the event time up to which everything was closed everywhere (pruning uses it)."""
        marks = [m for per_channel in self.watermarks.values() for m in per_channel.values()]
        return min(marks) if marks else None

    def watermark_ms(self, job_id: str) -> int:
        """How far the job's windows are complete: the watermark of the slowest source holding
        one of its nodes. A source not heard from yet counts as not started: at start on a
        backlog the first partition processed runs far ahead, and the minimum over the sources
        heard from would release windows before the others' nodes arrived. Sources without the
        job's nodes are not waited for (an idle one must not stall it). A job whose nodes are
        not known yet (live, its window batches read before its start event on this channel:
        one agent reads both topics, in no order between them) waits for every source: its
        nodes may be in any, and the slowest one heard from released windows before the
        batches of sources not heard from yet (found by the demo's live = replay test).
        Offline (one source), the slowest source heard from."""
        marks = self.watermarks.get(self.channel_of.get(job_id, -1), {})
        partition_of = self.partition_of
        if partition_of is None:
            return min(marks.values()) if marks else NEVER_MS
        nodes = self.jobs.nodes_of(job_id)
        if not nodes:
            return min(marks.get(s, NEVER_MS) for s in range(max(1, self.fleet_sources)))
        return min(marks.get(partition_of(n), NEVER_MS) for n in nodes)

    def prune(self, watermark_ms: int, idle_ms: int) -> None:
        """Forget ended jobs (see :meth:`JobStage.prune`): a job with neither pending windows
        nor a detector state left is restored again (:meth:`seen`) if it comes back."""
        self.stage.prune(watermark_ms, idle_ms)
        for watch in self.fleets.values():
            watch.prune(watermark_ms - idle_ms)
        for job_id in [j for j in self.channel_of if j not in self.stage.pending]:
            if job_id not in self.stage.states:
                del self.channel_of[job_id]
                self._seen.discard(job_id)

    def forget(self) -> None:
        """Forget every job (pending windows, detector states, step times, newest releases) and
        every watermark, keeping the counters: after a rebalance another worker may have moved
        a job on, and the changelog tables hold the truth. Each job is restored from them
        (:meth:`restore`) at its next message; watermarks come back with the next heartbeats."""
        stage = self.stage
        for held in (stage.pending, stage.states, stage.released, stage.steps, stage.whole,
                     stage._whole_keys):  # fmt: skip
            held.clear()
        for mine in (self.watermarks, self.channel_of, self.sources, self._seen, self.fleets):
            mine.clear()

    # -- state ----------------------------------------------------------------------------------
    def seen(self, job_id: str) -> bool:
        """Whether the job was added or restored here (else restore it first, once)."""
        return job_id in self._seen

    def saved_state(self, job_id: str) -> dict[str, Any]:
        """The job's state to keep across restarts besides its pending batches: its detector
        state (``detector``) and the start of its newest released window (``released_ms``)."""
        out: dict[str, Any] = {}
        if job_id in self.stage.states:
            out["detector"] = self.stage.states[job_id].to_dict()
        if job_id in self.stage.released:
            out["released_ms"] = self.stage.released[job_id]
        return out

    def restore(
        self, job_id: str, saved: Mapping[str, Any], pending: Iterable[Mapping[str, Any]]
    ) -> list[PendingEntry]:
        """A job first seen by this process: its :meth:`saved_state` and its pending batch
        messages (:func:`batches_of_message`) as a changelog kept them, each with the channel it
        arrived on (``channel``, so that heartbeats release it before another batch comes);
        later releases are the same as without the restart. Returns the entries for windows
        the job had already released (a deletion that did not reach the changelog): to delete.
        Raises KeyError, ValueError or TypeError for a malformed message."""
        self._seen.add(job_id)
        if saved.get("detector"):
            self.stage.states[job_id] = JobDetectorState.from_dict(saved["detector"])
        if saved.get("released_ms") is not None:
            self.stage.released[job_id] = int(saved["released_ms"])
        stale: list[PendingEntry] = []
        for message in pending:
            for batch, srcs in batches_of_message(message):
                if message.get("channel") is not None:
                    self.channel_of.setdefault(batch.job_id, int(message["channel"]))
                if not self._hold(batch, srcs):
                    stale += [PendingEntry(batch.job_id, batch.window_start_ms, s) for s in srcs]
        return stale


def _whole(batch: HeldBatch) -> bool:
    """Whether a window's first batch is held as it came: the aggregator's columns, each GPU
    once (a batch of dicts is keyed by GPU at once)."""
    if isinstance(batch, ColumnsBatch):
        return True  # a GPU given twice is seen when released (:func:`_merged`)
    keys = batch.columns.keys if batch.columns is not None else None
    return keys is not None and len(set(keys)) == len(keys)


def _mergeable(batch: HeldBatch) -> bool:
    """Whether a batch's windows are the aggregator's, as columns no one changed (merged as
    columns with other such batches of its window)."""
    if isinstance(batch, ColumnsBatch):
        return True
    w = batch.windows
    return batch.columns is not None and isinstance(w, LazyWindows) and w.untouched


def _keys(batch: HeldBatch) -> list[str]:
    """The GPU keys of a batch's windows (one held whole)."""
    if isinstance(batch, ColumnsBatch):
        return batch.gpu_keys()
    assert batch.columns is not None
    return batch.columns.keys


def _count(batch: HeldBatch) -> int:
    """How many windows a batch holds."""
    return len(batch) if isinstance(batch, ColumnsBatch) else len(batch.windows)


def _windows(batch: HeldBatch) -> Sequence[dict[str, Any]]:
    """A batch's GpuWindow dicts."""
    return batch.batch().windows if isinstance(batch, ColumnsBatch) else batch.windows


def _merged(
    batches: list[HeldBatch],
) -> tuple[Sequence[dict[str, Any]], WindowColumns | None]:
    """The windows and columns of a window's batches held whole, sorted by GPU as the
    aggregator sorts them: several merged as columns, the windows and columns made once. A GPU
    given twice in one batch (never by the aggregator): its later window stands, and the
    detector reads the dicts (no columns)."""
    first = batches[0]
    if len(batches) == 1 and isinstance(first, JobWindowBatch):
        return first.windows, first.columns
    parts = [b.closed if isinstance(b, ColumnsBatch) else cast(LazyWindows, b.windows).closed()
             for b in batches]  # fmt: skip
    start, end = first.window_start_ms, first.window_end_ms
    made = ColumnsBatch(first.job_id, start, end, merge_closed(parts)).batch()
    assert made.columns is not None
    if len(set(made.columns.keys)) == len(made.columns.keys):
        return made.windows, made.columns
    keyed: dict[tuple[str, int], dict[str, Any]] = {}
    _fill(keyed, made.windows)
    return [keyed[k] for k in sorted(keyed)], None


def _fill(slot: dict[tuple[str, int], dict[str, Any]], ws: Sequence[dict[str, Any]]) -> None:
    """Hold windows by GPU: ``slot[(str(w["node"]), int(w["gpu_index"]))] = w``, the loop in C."""
    keys = zip(map(str, map(_NODE, ws)), map(int, map(_GPU_INDEX, ws)), strict=True)
    slot.update(zip(keys, ws, strict=True))
