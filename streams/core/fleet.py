"""Fleet context: a power cap or a cooling event moving a whole Slurm partition at once.

When a facility lowers every GPU's power limit, every busy GPU of the partition runs at its SW
power cap and its clocks drop together; when its cooling degrades, every GPU enters thermal
slowdown. No GPU is at fault and no job can act on it, so it is **one** fleet-level finding, not
an alert per job. This pure, event-time watch reads every closed GpuWindow of a window start
(the aggregator's output, before the per-job detector sees it) and, per Slurm partition:

- counts the reporting GPUs of jobs (idle GPUs draw too little power to hit a cap) and those
  at the SW power cap, or in thermal slowdown, for at least ``fleet_cap_frac`` of the window;
- when at least ``fleet_min_gpus`` GPUs report and at least ``fleet_cap_share`` of them are
  capped (cause ``POWER``) or hot (cause ``THERMAL``), the partition is in a *fleet shift*: its
  first window opens one ``FLEET_WIDE`` finding (job id ``fleet``, no node) with the evidence
  (how many GPUs, how many capped or hot, the median clock ratio against the partition's own
  median before the shift);
- while the shift lasts, every window of the partition carries ``fleet_clk_ratio``: the
  partition's median clock ratio over its median before the shift. A small job (too few GPUs
  for peers) compares each GPU with its own past; the detector judges that comparison against
  this ratio, so a GPU that only moved with its partition is not flagged and one that dropped
  further still is. Large jobs need nothing: peers inside a job move together;
- ``clear_after_s`` of windows without the shift close it with one ``CLEARED`` finding; a shift
  of the other cause while one is open closes the open one and opens its own.

One decision for the whole fleet, however the samples are split (DETECTION.md item 12). Each
*source* (a samples partition: one aggregator) makes a :class:`SourceCensus` per Slurm partition
of every window start it closes: counts and the clock ratios themselves, so merged censuses give
the exact median. The watch merges the censuses of all ``sources`` and judges a window start
once every source closed it (:meth:`FleetWatch.closed`): the same findings and ratios from one
source (replay: one aggregator) or from twelve (live). Live, one watch judges: the hot stage
sends every partition's censuses to stage-3 channel :data:`FLEET_CHANNEL` only, whose watch
judges each window start once, publishes the findings and sends its *verdict* (how far it
judged, and the ratios of the starts in a shift) to the other channels, which hold it in a
:class:`FleetVerdicts`. Stage 3 releases a window only once its start is judged, so small jobs
get the ratio (:class:`~peerwatch.streams.core.job_stage.JobReleaser`). Before, every channel
merged and judged every census itself: the same decision, made once per channel.
"""

from __future__ import annotations

import base64
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np

from peerwatch.schemas.records import (
    FeatureEvidence,
    FindingCause,
    FindingStatus,
    GpuWindow,
    StragglerFinding,
)
from peerwatch.streams.core.model import CLEARED, FLEET_WIDE, field_rows, is_idle_job, stable_id
from peerwatch.streams.core.robust import array_median
from peerwatch.streams.core.settings import DetectorSettings

if TYPE_CHECKING:
    from peerwatch.streams.core.windows import ClosedWindows

#: The job id of a fleet-level finding (it spans every job of the partition).
FLEET_JOB = "fleet"
#: The stage-3 channel whose fleet watch judges (live: the censuses go there only) and
#: publishes the fleet findings; the other channels get its verdicts.
FLEET_CHANNEL = 0
#: A fleet clock ratio a verdict may carry (clock / its maximum; more is a broken message).
MAX_RATIO = 4.0
#: Medians of this many shift-free windows make a partition's reference clock ratio.
REFERENCE_WINDOWS = 12


@dataclass
class _Partition:
    """One Slurm partition's memory: recent clean clock medians and the open shift."""

    clean_clk: list[float] = field(default_factory=list)
    finding_id: str | None = None
    cause: FindingCause = "POWER"
    start_ms: int = 0
    quiet_windows: int = 0
    reference_clk: float | None = None


def _partition_of(saved: dict[str, Any]) -> _Partition:
    """A :class:`_Partition` from its saved fields, each checked. Raises KeyError, ValueError,
    TypeError or AttributeError for another value."""
    cause = saved["cause"]
    if cause not in ("POWER", "THERMAL"):
        raise ValueError(f"fleet cause {cause!r}")
    finding_id, reference = saved["finding_id"], saved["reference_clk"]
    return _Partition(
        clean_clk=[float(c) for c in saved["clean_clk"]][-REFERENCE_WINDOWS:],
        finding_id=None if finding_id is None else str(finding_id),
        cause=cause,
        start_ms=int(saved["start_ms"]),
        quiet_windows=int(saved["quiet_windows"]),
        reference_clk=None if reference is None else float(reference),
    )


@dataclass(frozen=True)
class WindowCensus:
    """What one partition's GPUs did in one window."""

    gpus: int
    capped: int
    clk_median: float | None
    hot: int = 0


class SourceCensus(NamedTuple):
    """One source's share of one Slurm partition in one window: reporting GPUs of jobs, capped
    ones, hot ones and their clock ratios (sorted; only the GPUs with a reading). Censuses of
    several sources merge (:func:`merge`) into the census of them all."""

    gpus: int
    capped: int
    hot: int
    clks: tuple[float, ...]

    def to_json(self) -> list[Any]:
        """A JSON value; the clock ratios as their float64 bytes in base64 (exact, and read
        back without parsing a number per GPU: every stage-3 partition reads each census)."""
        raw = np.asarray(self.clks, "<f8").tobytes()
        return [self.gpus, self.capped, self.hot, base64.b64encode(raw).decode("ascii")]

    @classmethod
    def from_json(cls, value: Any) -> SourceCensus:
        """Inverse of :meth:`to_json`. Raises ValueError or TypeError for another value."""
        gpus, capped, hot, clks = value
        raw = base64.b64decode(clks, validate=True)
        if len(raw) % 8:
            raise ValueError(f"clock ratios of {len(raw)} bytes, not float64s")
        ratios = np.frombuffer(raw, "<f8")
        if not ((ratios >= 0.0) & (ratios <= MAX_RATIO)).all():  # NaN fails both
            raise ValueError(f"a clock ratio is NaN or not in [0, {MAX_RATIO}]")
        counts = int(gpus), int(capped), int(hot)
        if not 0 <= counts[1] <= counts[0] or not 0 <= counts[2] <= counts[0]:
            raise ValueError(f"census counts {counts}: not 0 <= capped, hot <= gpus")
        return cls(*counts, tuple(ratios.tolist()))


def merge(parts: Sequence[SourceCensus]) -> WindowCensus:
    """The census of a Slurm partition's window from every source's share of it."""
    clks = np.array([c for p in parts for c in p.clks], np.float64)
    return WindowCensus(
        sum(p.gpus for p in parts),
        sum(p.capped for p in parts),
        array_median(clks) if len(clks) else None,
        sum(p.hot for p in parts),
    )


#: What :func:`census` reads of each window, in the order it unpacks them.
_CENSUS = ("job_id", "power_cap_frac", "lost", "samples", "partition", "thermal_frac", "clk_ratio")


def census(windows: Sequence[GpuWindow], cap_frac: float) -> dict[str, SourceCensus]:
    """Per Slurm partition (``""`` when unknown): reporting GPUs of jobs, capped ones, hot ones
    (thermal slowdown) and the median clock ratio. Windows of idle GPUs, lost GPUs and GPUs
    without samples do not count. GpuWindow dicts; :func:`census_closed` takes the
    aggregator's columns (both count through :func:`census_of`)."""
    idle: dict[object, bool] = {}
    names: dict[str, int] = {}
    counted: list[bool] = []
    partition: list[int] = []
    caps: list[float] = []
    thermal: list[float] = []
    clks: list[float] = []
    nan = float("nan")
    for job, cap, lost, samples, part, thm, clk in field_rows(windows, *_CENSUS):
        is_idle = idle.get(job)
        if is_idle is None:
            is_idle = idle[job] = is_idle_job(str(job))
        counted.append(not (is_idle or cap is None or lost or not samples))
        partition.append(names.setdefault(str(part or ""), len(names)))
        caps.append(nan if cap is None else cap)
        thermal.append(thm or 0.0)
        clks.append(nan if clk is None else float(clk))
    return census_of(
        list(names), np.array(partition, np.int64), np.array(counted, np.bool_),
        np.array(caps, np.float64), np.array(thermal, np.float64), np.array(clks, np.float64),
        cap_frac,
    )  # fmt: skip


def census_closed(parts: Sequence[ClosedWindows], cap_frac: float) -> dict[str, SourceCensus]:
    """:func:`census` of the windows of one window start as the aggregator closed them
    (:class:`~peerwatch.streams.core.windows.ClosedWindows`, one or more parts): the same
    values as the census of their GpuWindow dicts, read from the columns (no dict, no Python
    statement per window)."""
    names: dict[str, int] = {}
    columns: list[tuple[np.ndarray, ...]] = []
    for part in parts:
        codes = sorted(part.jobs)
        if not codes:
            continue
        # per job code: its partition's number and whether it is an idle pseudo job
        lookup = np.zeros(codes[-1] + 1, np.int64)
        idle = np.zeros(codes[-1] + 1, np.bool_)
        for code in codes:
            job_id, _, part_name, _ = part.jobs[code]
            lookup[code] = names.setdefault(str(part_name or ""), len(names))
            idle[code] = is_idle_job(job_id)
        job = part.accs["job"]
        cap, cap_present = part.shares("cap")
        thermal, _ = part.shares("thm")  # None counts as 0.0, as in the dicts' census
        clk, clk_present = part.ratio("clk_s", "clk_n")
        counted = ~idle[job] & cap_present & (part.accs["lost"] <= 0) & (part.accs["n"] != 0)
        columns.append((lookup[job], counted, cap, thermal, np.where(clk_present, clk, np.nan)))
    if not columns:
        return {}
    partition, counted, cap, thermal, clk = (np.concatenate(c) for c in zip(*columns, strict=True))
    return census_of(list(names), partition, counted, cap, thermal, clk, cap_frac)


def censuses_closed(
    parts: Sequence[ClosedWindows], cap_frac: float
) -> list[tuple[int, int, dict[str, SourceCensus]]]:
    """One source's censuses of closed windows as the aggregator's columns (any number of
    window starts, each in one or more parts): (start, end, census) per start in increasing
    order; a start without windows has none (it is not judged)."""
    by_start: dict[int, list[ClosedWindows]] = {}
    for part in parts:
        if len(part.node):
            by_start.setdefault(part.start_ms, []).append(part)
    return [
        (start, group[0].end_ms, census_closed(group, cap_frac))
        for start, group in sorted(by_start.items())
    ]


def census_of(
    names: Sequence[str],
    partition: np.ndarray,
    counted: np.ndarray,
    cap: np.ndarray,
    thermal: np.ndarray,
    clk: np.ndarray,
    cap_frac: float,
) -> dict[str, SourceCensus]:
    """The census arithmetic, one value per window: its partition (an index into ``names``),
    whether it counts (a reporting GPU of a job), its power cap share, thermal share (0.0 where
    unknown) and clock ratio (NaN where unknown)."""
    out: dict[str, SourceCensus] = {}
    order = sorted(range(len(names)), key=names.__getitem__)
    for p in order:
        mine = counted & (partition == p)
        n = int(mine.sum())
        if not n:
            continue
        clks = clk[mine]
        clks = clks[~np.isnan(clks)]
        out[names[p]] = SourceCensus(
            n,
            int((cap[mine] >= cap_frac).sum()),
            int((thermal[mine] >= cap_frac).sum()),
            tuple(np.sort(clks).tolist()),
        )
    return out


def shift_cause(c: WindowCensus | None, settings: DetectorSettings) -> FindingCause | None:
    """``POWER`` or ``THERMAL`` when enough of the partition's busy GPUs are capped or hot at
    once (capped first), else None."""
    if c is None or c.gpus < settings.fleet_min_gpus:
        return None
    need = settings.fleet_cap_share * c.gpus
    if c.capped >= need:
        return "POWER"
    if c.hot >= need:
        return "THERMAL"
    return None


def set_ratios(windows: Iterable[dict[str, Any]], ratios: dict[str, float]) -> None:
    """Give each window of a partition in a fleet shift its ``fleet_clk_ratio`` (``ratios``:
    per partition name, ``""`` for windows without one)."""
    if not ratios:
        return
    for w in windows:
        ratio = ratios.get(str(w.get("partition") or ""))
        if ratio is not None:
            w["fleet_clk_ratio"] = ratio


class FleetVerdicts:
    """The fleet watch's decisions as a channel that does not judge holds them (see the module
    docstring): how far window starts are judged and the ``fleet_clk_ratio`` of each Slurm
    partition in a shift at a judged start. A :class:`FleetWatch` keeps its own in one."""

    def __init__(self) -> None:
        #: windows ending at or before this (ms) are judged; None: nothing judged yet
        self.until_ms: int | None = None
        #: window start -> the ``fleet_clk_ratio`` of each Slurm partition in a shift then
        self.shifted: dict[int, dict[str, float]] = {}

    @property
    def judged_until_ms(self) -> int | None:
        """Windows ending at or before this are judged; None while nothing is."""
        return self.until_ms

    def ratios(self, start_ms: int) -> dict[str, float]:
        """The ``fleet_clk_ratio`` of each Slurm partition in a shift at a judged window start."""
        return self.shifted.get(start_ms, {})

    def prune(self, before_ms: int) -> None:
        """Forget the ratios of window starts before ``before_ms`` (released long ago)."""
        for start in [s for s in self.shifted if s < before_ms]:
            del self.shifted[start]

    def since(self, after_ms: int | None) -> dict[str, Any]:
        """The verdict message of the starts judged after ``after_ms`` (None: all kept), JSON
        values: ``until`` (ms) and ``shifted`` (start -> partition -> ratio)."""
        return {
            "kind": "fleet",
            "until": self.until_ms,
            "shifted": {str(s): r for s, r in sorted(self.shifted.items())
                        if after_ms is None or s > after_ms},
        }  # fmt: skip

    def apply(self, message: dict[str, Any]) -> None:
        """A verdict message (:meth:`since`) of the judging channel: judged further (never
        back), and the ratios of its starts. Raises KeyError, ValueError or TypeError for a
        malformed one (nothing is kept of it)."""
        until, raw = message["until"], message["shifted"]
        until = None if until is None else int(until)
        if not isinstance(raw, dict) or not all(isinstance(r, dict) for r in raw.values()):
            raise TypeError("fleet verdict ratios are not start -> partition -> ratio")
        shifted = {int(s): {str(k): float(v) for k, v in r.items()} for s, r in raw.items()}
        if any(not 0.0 <= v <= MAX_RATIO for r in shifted.values() for v in r.values()):
            raise ValueError(f"fleet verdict ratio not in [0, {MAX_RATIO}] (or NaN)")
        if until is not None and (self.until_ms is None or until > self.until_ms):
            self.until_ms = until
        self.shifted.update(shifted)

    def to_dict(self) -> dict[str, Any]:
        """The verdicts held, as JSON values (a changelog keeps them across restarts)."""
        return self.since(None)

    def restore(self, data: dict[str, Any]) -> None:
        """The verdicts of :meth:`to_dict` back. Raises as :meth:`apply`."""
        fresh = FleetVerdicts()
        fresh.apply(data)
        self.until_ms, self.shifted = fresh.until_ms, fresh.shifted


class FleetWatch:
    """See the module docstring. Feed it each source's censuses (:meth:`add`, or
    :meth:`add_closed` of the aggregator's closed windows) and how far each source closed
    (:meth:`closed`); :meth:`judge` then judges every window start all ``sources`` (0 ..
    sources - 1) closed, in increasing order. A source's census of a start already judged is
    ignored (a restarted hot stage sends it again)."""

    def __init__(self, settings: DetectorSettings, sources: int = 1) -> None:
        if sources < 1:
            raise ValueError("a fleet watch needs at least one source")
        self.settings = settings
        self.sources = sources
        self.partitions: dict[str, _Partition] = {}
        self.last_start_ms: int | None = None
        self.findings = 0
        #: window start -> (its end, Slurm partition -> source -> its census so far)
        self.waiting: dict[int, tuple[int, dict[str, dict[int, SourceCensus]]]] = {}
        #: source -> closed until (ms); a source without one holds every start back
        self.marks: dict[int, int] = {}
        #: what it decided (the ratios of the starts in a shift), as the other channels hold it
        self.verdicts = FleetVerdicts()

    @property
    def shifted(self) -> dict[int, dict[str, float]]:
        """Window start -> the ``fleet_clk_ratio`` of each Slurm partition in a shift then."""
        return self.verdicts.shifted

    # -- input ----------------------------------------------------------------------------------
    def add(self, src: int, start_ms: int, end_ms: int, seen: dict[str, SourceCensus]) -> None:
        """Source ``src``'s censuses of one window start (Slurm partition -> its share; empty
        when its windows there were all of idle or lost GPUs: the start is still judged). The
        same source's census of the same start again (re-sent after a restart) replaces it."""
        if self.last_start_ms is not None and start_ms <= self.last_start_ms:
            return
        slot = self.waiting.setdefault(start_ms, (end_ms, {}))[1]
        for name, c in seen.items():
            slot.setdefault(name, {})[src] = c

    def add_closed(self, src: int, parts: Sequence[ClosedWindows]) -> None:
        """:meth:`add` of closed windows as the aggregator's columns (:func:`censuses_closed`)."""
        for start, end, seen in censuses_closed(parts, self.settings.fleet_cap_frac):
            self.add(src, start, end, seen)

    def closed(self, src: int, until_ms: int) -> None:
        """Source ``src`` closed every window ending at or before ``until_ms`` (never goes
        back)."""
        self.marks[src] = max(self.marks.get(src, until_ms), until_ms)

    @property
    def judged_until_ms(self) -> int | None:
        """Windows ending at or before this are judged (every source closed them); None while a
        source was not heard from."""
        if any(s not in self.marks for s in range(self.sources)):
            return None
        return min(self.marks[s] for s in range(self.sources))

    def judge(self) -> list[StragglerFinding]:
        """The findings of every window start that all sources closed, in start order
        (FLEET_WIDE when a shift starts, CLEARED when one ended)."""
        until = self.judged_until_ms
        if until is None:
            return []
        found: list[StragglerFinding] = []
        for start in sorted(self.waiting):
            end, slot = self.waiting[start]
            if end > until:
                break
            del self.waiting[start]
            self.last_start_ms = start
            seen = {name: merge(list(cs.values())) for name, cs in slot.items()}
            out, ratios = self._judge(start, end, seen)
            found += out
            if ratios:
                self.shifted[start] = ratios
        return found

    def ratios(self, start_ms: int) -> dict[str, float]:
        """The ``fleet_clk_ratio`` of each Slurm partition in a shift at a judged window start."""
        return self.verdicts.ratios(start_ms)

    def prune(self, before_ms: int) -> None:
        """Forget the ratios of window starts before ``before_ms`` (released long ago)."""
        self.verdicts.prune(before_ms)

    def verdict(self, after_ms: int | None) -> dict[str, Any]:
        """The verdict message for the channels that do not judge: how far this watch judged
        and the ratios of the starts after ``after_ms`` in a shift (:meth:`FleetVerdicts.since`)."""
        self.verdicts.until_ms = self.judged_until_ms
        return self.verdicts.since(after_ms)

    def observe(
        self, window_start_ms: int, window_end_ms: int, windows: Iterable[GpuWindow]
    ) -> list[StragglerFinding]:
        """One source's whole window start as GpuWindow dicts, judged at once: its findings;
        each window of a partition in a shift gets its ``fleet_clk_ratio``. An older or
        repeated window start changes nothing."""
        windows = list(windows)
        self.add(0, window_start_ms, window_end_ms, census(windows, self.settings.fleet_cap_frac))
        self.closed(0, window_end_ms)
        found = self.judge()
        set_ratios(cast(list[dict[str, Any]], windows), self.ratios(window_start_ms))
        return found

    def _judge(
        self, window_start_ms: int, window_end_ms: int, seen: dict[str, WindowCensus]
    ) -> tuple[list[StragglerFinding], dict[str, float]]:
        """One window start's census against each partition's memory: the findings, and the
        clock ratio of each partition in a shift."""
        s = self.settings
        out: list[StragglerFinding] = []
        ratios: dict[str, float] = {}
        for name in sorted(set(seen) | set(self.partitions)):
            part = self.partitions.setdefault(name, _Partition())
            c = seen.get(name)
            cause = shift_cause(c, s)
            if cause is not None and c is not None:
                part.quiet_windows = 0
                if part.finding_id is not None and cause != part.cause:
                    # Another event (a power cap while a cooling event is still open): the
                    # open episode ends here and a new one starts with its own cause.
                    out.append(self._finding(part, name, CLEARED, window_end_ms, c))
                    part.finding_id = None
                if part.finding_id is None:
                    part.finding_id = stable_id(
                        FLEET_JOB, name, FLEET_WIDE, cause, window_start_ms,
                        hex_chars=s.id_hex_chars,
                    )  # fmt: skip
                    part.cause = cause
                    part.start_ms = window_start_ms
                    part.reference_clk = (
                        statistics.median(part.clean_clk) if part.clean_clk else None
                    )
                    out.append(self._finding(part, name, FLEET_WIDE, window_end_ms, c))
                if c.clk_median is not None and part.reference_clk:
                    ratios[name] = c.clk_median / part.reference_clk
                continue
            if c is not None and c.clk_median is not None and c.capped == 0 and c.hot == 0:
                part.clean_clk.append(c.clk_median)
                del part.clean_clk[:-REFERENCE_WINDOWS]
            if part.finding_id is not None:
                part.quiet_windows += 1
                if part.quiet_windows >= s.clear_after_windows:
                    out.append(self._finding(part, name, CLEARED, window_end_ms, c))
                    part.finding_id = None
                    part.quiet_windows = 0
        self.findings += len(out)
        return out, ratios

    def _finding(
        self,
        part: _Partition,
        name: str,
        status: FindingStatus,
        end_ms: int,
        c: WindowCensus | None,
    ) -> StragglerFinding:
        assert part.finding_id is not None
        finding_id = part.finding_id
        where = f"partition {name}" if name else "the fleet"
        features: list[FeatureEvidence] = []
        gpus = c.gpus if c is not None else 0
        capped = 0 if c is None else c.capped if part.cause == "POWER" else c.hot
        what = "power cap" if part.cause == "POWER" else "thermal slowdown"
        if status == CLEARED:
            finding_id = stable_id(finding_id, CLEARED, hex_chars=self.settings.id_hex_chars)
            reason = f"fleet-wide {what} in {where} over"
        else:
            shift = ""
            if c is not None and c.clk_median is not None and part.reference_clk:
                rel = c.clk_median / part.reference_clk - 1.0
                shift = f"; median clk {rel * 100:+.1f}% against before"
                features.append({
                    "feature": "clk", "value": c.clk_median, "peer_median": part.reference_clk,
                    "mad": 0.0, "z": 0.0,
                })  # fmt: skip
            state = "at the SW power cap" if part.cause == "POWER" else "in thermal slowdown"
            reason = (
                f"fleet-wide: {capped} of {gpus} busy GPUs in {where} {state}{shift}; no GPU blamed"
            )
        return {
            "finding_id": finding_id,
            "job_id": FLEET_JOB,
            "node": None,
            "gpu_index": None,
            "gpu_uuid": None,
            "status": status,
            "window_start_ms": part.start_ms,
            "window_end_ms": end_ms,
            "features": features,
            "hard_rules": [],
            "windows_flagged": capped,
            "windows_considered": gpus,
            "first_flagged_ms": part.start_ms,
            "peer_group_size": gpus,
            "reason": reason,
            "cause": part.cause,
            # A window-based verdict has its evidence when the window's last moment has been seen.
            "detected_ms": end_ms,
            "port": None,
            "switch": None,
        }

    def counters(self) -> dict[str, int]:
        return {"fleet_findings": self.findings}

    # -- state ----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The watch's memory as JSON values (a changelog keeps it across restarts)."""
        return {
            "partitions": {n: {"clean_clk": p.clean_clk, "finding_id": p.finding_id,
                               "cause": p.cause, "start_ms": p.start_ms,
                               "quiet_windows": p.quiet_windows, "reference_clk": p.reference_clk}
                           for n, p in sorted(self.partitions.items())},
            "last_start_ms": self.last_start_ms,
            "shifted": {str(s): r for s, r in sorted(self.shifted.items())},
        }  # fmt: skip

    def restore(self, data: dict[str, Any]) -> None:
        """The memory of :meth:`to_dict` back (marks come again with the sources' next
        heartbeats; waiting censuses are read again: live, no offset past a census not judged
        yet is committed, :meth:`~peerwatch.streams.live.handlers.JobsHandler.commit_floor`),
        every value checked: nothing is kept of a damaged one.
        Raises KeyError, ValueError, TypeError or AttributeError for another value."""
        partitions = {str(n): _partition_of(p) for n, p in data["partitions"].items()}
        last = data["last_start_ms"]
        verdicts = FleetVerdicts()
        verdicts.apply({"until": None, "shifted": data["shifted"]})
        self.partitions, self.verdicts = partitions, verdicts
        self.last_start_ms = None if last is None else int(last)
