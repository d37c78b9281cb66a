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

Live, each hot-stage worker runs one watch over the nodes of its samples partitions (a random
sample of the fleet); finding ids are derived from the Slurm partition, the cause and the
episode's first window, so workers that see the same shift start publish the same finding id.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

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
    from peerwatch.streams.core.windows import ClosedWindows, JobWindowBatch

#: The job id of a fleet-level finding (it spans every job of the partition).
FLEET_JOB = "fleet"
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


@dataclass(frozen=True)
class WindowCensus:
    """What one partition's GPUs did in one window."""

    gpus: int
    capped: int
    clk_median: float | None
    hot: int = 0


#: What :func:`census` reads of each window, in the order it unpacks them.
_CENSUS = ("job_id", "power_cap_frac", "lost", "samples", "partition", "thermal_frac", "clk_ratio")


def census(windows: Sequence[GpuWindow], cap_frac: float) -> dict[str, WindowCensus]:
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


def census_closed(parts: Sequence[ClosedWindows], cap_frac: float) -> dict[str, WindowCensus]:
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


def census_of(
    names: Sequence[str],
    partition: np.ndarray,
    counted: np.ndarray,
    cap: np.ndarray,
    thermal: np.ndarray,
    clk: np.ndarray,
    cap_frac: float,
) -> dict[str, WindowCensus]:
    """The census arithmetic, one value per window: its partition (an index into ``names``),
    whether it counts (a reporting GPU of a job), its power cap share, thermal share (0.0 where
    unknown) and clock ratio (NaN where unknown)."""
    out: dict[str, WindowCensus] = {}
    order = sorted(range(len(names)), key=names.__getitem__)
    for p in order:
        mine = counted & (partition == p)
        n = int(mine.sum())
        if not n:
            continue
        clks = clk[mine]
        clks = clks[~np.isnan(clks)]
        out[names[p]] = WindowCensus(
            n,
            int((cap[mine] >= cap_frac).sum()),
            array_median(clks) if len(clks) else None,
            int((thermal[mine] >= cap_frac).sum()),
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


class FleetWatch:
    """See the module docstring. Feed it every closed window of one window start at a time,
    window starts in increasing order: as the aggregator's columns (:meth:`observe_closed`, the
    live hot stage and replay) or as GpuWindow dicts (:meth:`observe`)."""

    def __init__(self, settings: DetectorSettings) -> None:
        self.settings = settings
        self.partitions: dict[str, _Partition] = {}
        self.last_start_ms: int | None = None
        self.findings = 0

    def observe(
        self, window_start_ms: int, window_end_ms: int, windows: Iterable[GpuWindow]
    ) -> list[StragglerFinding]:
        """The fleet findings of one window start from its GpuWindow dicts (FLEET_WIDE when a
        shift starts, CLEARED when it ended); each window of a partition in a shift gets its
        ``fleet_clk_ratio``. An older or repeated window start changes nothing."""
        if not self._fresh(window_start_ms):
            return []
        windows = list(windows)
        seen = census(windows, self.settings.fleet_cap_frac)
        found, ratios = self._judge(window_start_ms, window_end_ms, seen)
        set_ratios(cast(list[dict[str, Any]], windows), ratios)
        return found

    def observe_closed(
        self, parts: Sequence[ClosedWindows]
    ) -> tuple[list[StragglerFinding], dict[int, dict[str, float]]]:
        """:meth:`observe` of closed windows as the aggregator's columns (any number of window
        starts, each in one or more parts), before their dicts are made: the findings, and the
        ``fleet_clk_ratio`` of each partition in a shift per window start, for
        :func:`set_ratios` to give the windows once they are dicts."""
        by_start: dict[int, list[ClosedWindows]] = {}
        for part in parts:
            if len(part.node):  # a start without windows is not judged (as with no dicts)
                by_start.setdefault(part.start_ms, []).append(part)
        found: list[StragglerFinding] = []
        ratios: dict[int, dict[str, float]] = {}
        for start in sorted(by_start):
            if not self._fresh(start):
                continue
            group = by_start[start]
            seen = census_closed(group, self.settings.fleet_cap_frac)
            out, shifted = self._judge(start, group[0].end_ms, seen)
            found += out
            if shifted:
                ratios[start] = shifted
        return found, ratios

    def judge_and_group(
        self,
        parts: Sequence[ClosedWindows],
        group: Callable[[Sequence[ClosedWindows]], list[JobWindowBatch]],
    ) -> tuple[list[StragglerFinding], list[JobWindowBatch]]:
        """:meth:`observe_closed`, then the windows as dicts per job (``group``: the
        aggregator's), those of a partition in a fleet shift with their ``fleet_clk_ratio``:
        what the live hot stage and replay do with each batch of closed windows."""
        found, ratios = self.observe_closed(parts)
        batches = group(parts)
        for b in batches:
            if b.window_start_ms in ratios:
                set_ratios(b.windows, ratios[b.window_start_ms])
        return found, batches

    def _fresh(self, window_start_ms: int) -> bool:
        """Whether a window start is newer than every one judged (it is then the latest)."""
        if self.last_start_ms is not None and window_start_ms <= self.last_start_ms:
            return False
        self.last_start_ms = window_start_ms
        return True

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
