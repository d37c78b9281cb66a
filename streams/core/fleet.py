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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

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
    without samples do not count. (Thousands of windows per call, live and in replay: one pass
    over the windows, the arithmetic in numpy.)"""
    idle: dict[object, bool] = {}
    # partition -> (power cap shares, thermal shares, clock ratios: NaN where none)
    seen: dict[str, tuple[list[float], list[float], list[float]]] = {}
    nan = float("nan")
    for job, cap, lost, samples, partition, thermal, clk in field_rows(windows, *_CENSUS):
        is_idle = idle.get(job)
        if is_idle is None:
            is_idle = idle[job] = is_idle_job(str(job))
        if is_idle or cap is None or lost or not samples:
            continue
        name = str(partition or "")
        lists = seen.get(name)
        if lists is None:
            lists = seen[name] = ([], [], [])
        lists[0].append(cap)
        lists[1].append(thermal or 0.0)
        lists[2].append(nan if clk is None else float(clk))
    out: dict[str, WindowCensus] = {}
    for name in sorted(seen):
        caps, thermal, clk_ratios = (np.array(x, np.float64) for x in seen[name])
        clks = clk_ratios[~np.isnan(clk_ratios)]
        out[name] = WindowCensus(
            len(caps),
            int((caps >= cap_frac).sum()),
            array_median(clks) if len(clks) else None,
            int((thermal >= cap_frac).sum()),
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


class FleetWatch:
    """See the module docstring. Feed it every closed window of one window start at a time,
    window starts in increasing order (:meth:`observe`)."""

    def __init__(self, settings: DetectorSettings) -> None:
        self.settings = settings
        self.partitions: dict[str, _Partition] = {}
        self.last_start_ms: int | None = None
        self.findings = 0

    def observe(
        self, window_start_ms: int, window_end_ms: int, windows: Iterable[GpuWindow]
    ) -> list[StragglerFinding]:
        """The fleet findings of one window start (FLEET_WIDE when a shift starts, CLEARED when
        it ended); each window of a partition in a shift gets its ``fleet_clk_ratio``. An older
        or repeated window start changes nothing."""
        if self.last_start_ms is not None and window_start_ms <= self.last_start_ms:
            return []
        self.last_start_ms = window_start_ms
        s = self.settings
        out: list[StragglerFinding] = []
        windows = list(windows)
        seen = census(windows, s.fleet_cap_frac)
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
        if ratios:
            for w in windows:
                ratio = ratios.get(str(w.get("partition") or ""))
                if ratio is not None:
                    w["fleet_clk_ratio"] = ratio
        self.findings += len(out)
        return out

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
        }

    def counters(self) -> dict[str, int]:
        return {"fleet_findings": self.findings}
