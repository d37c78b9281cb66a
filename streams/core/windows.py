"""Stage 2, the hot path: attribute GPU readings to jobs and pre-aggregate event-time windows.

:class:`WindowAggregator` is fed BATCHES of decoded NodeGpuSample dicts (one node partition's
records; faust's per-event overhead is what the batching amortises, see STACK.md). Each GPU
reading is attributed to the job that owned the GPU at the sample's ``ts_ms`` (the
:class:`~peerwatch.streams.core.allocation.AllocationTable`), and accumulated per
(job, node, GPU, window) for windows of ``window_s`` aligned to the epoch. Readings of GPUs no
job owns are counted and dropped (no job, no peers).

Time: the watermark of a partition is the highest sample time seen minus ``lateness_s``
(the setting ``stream.lateness_s``, 5 s: node clocks are skewed by 1-2 s and agents publish at
their tick, so a few seconds cover skew and delivery jitter while keeping a finding within a
minute of the onset; a whole window of lateness would add 30 s to every detection).
:meth:`WindowAggregator.close_ready` emits every window whose end is at or before the watermark, grouped per (job, window). A sample older than
the last closed window boundary is *late*: ``add_batch`` returns it, and counts it, so the driver
can send it on (dead-letter / late topic); it is never silently dropped.

Counters (energy, throttle time, ECC, NVLink, PCIe replay) are turned into deltas between
consecutive samples of the same GPU; a delta belongs to the window of the later sample. A
counter that went down was reset (driver reload): the new value is the increase since then.
The per-reading work is a handful of dict reads and float ops on ``__slots__`` accumulators.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.model import IDLE_JOB_PREFIX
from peerwatch.streams.core.settings import DetectorSettings, StreamSettings

#: Clocks-event reasons that count as throttling: HW slowdown, SW thermal, HW thermal, brake.
THROTTLE_BITS = 0x8 | 0x20 | 0x40 | 0x80
#: SW power cap, kept apart from throttling.
POWER_CAP_BIT = 0x4
#: The settings tree's defaults (``detector.window_s``, ``stream.lateness_s``).
DEFAULT_WINDOW_S = DetectorSettings().window_s
DEFAULT_LATENESS_S = StreamSettings().lateness_s

_ACC_FIELDS = (
    "job", "idx", "uuid", "n", "clk_s", "clk_n", "sm_s", "sm_n", "pw_s", "pw_n", "pr_s", "pr_n",
    "temp", "energy", "energy_n", "thr_ns", "thr_dt", "cap_ns", "cap_dt", "bits_n", "thr_bits",
    "cap_bits", "ecc", "nvl", "pcie", "wmin", "wmax", "remap_p", "remap_f", "lost", "xids",
)  # fmt: skip
_PREV_FIELDS = ("ts", "energy", "thr", "cap", "ecc", "nvl", "pcie")


class _Acc:
    """Running sums of one GPU in one job in one window."""

    __slots__ = _ACC_FIELDS

    def __init__(self, job: str, idx: int = 0) -> None:
        self.job = job
        self.idx = idx
        self.uuid: str | None = None
        self.n = self.clk_n = self.sm_n = self.pw_n = self.pr_n = self.energy_n = 0
        self.clk_s = self.sm_s = self.pw_s = self.pr_s = 0.0
        self.temp: int | None = None
        self.energy = self.thr_ns = self.thr_dt = self.cap_ns = self.cap_dt = 0
        self.bits_n = self.thr_bits = self.cap_bits = 0
        self.ecc = self.nvl = self.pcie = 0
        self.wmin: int | None = None
        self.wmax: int | None = None
        self.remap_p = self.remap_f = self.lost = False
        self.xids: list[int] = []


class _Prev:
    """Last counter values of one GPU (any job), for deltas."""

    __slots__ = _PREV_FIELDS

    def __init__(self) -> None:
        self.ts = -1
        self.energy: int | None = None
        self.thr: int | None = None
        self.cap: int | None = None
        self.ecc: int | None = None
        self.nvl: int | None = None
        self.pcie: int | None = None


class _Node:
    """Per-node state: open windows, counter memory, cached owner segment."""

    __slots__ = ("buckets", "owners", "prev", "seg_hi", "seg_lo", "version")

    def __init__(self) -> None:
        # window start -> {gpu index: acc}; a GPU that changed owner inside a window has its
        # other job's acc under the key (job_id, index).
        self.buckets: dict[int, dict[Any, _Acc]] = {}
        self.prev: dict[int, _Prev] = {}
        self.owners: dict[int, str] = {}
        self.seg_lo = 0
        self.seg_hi: int | None = -1  # forces a lookup on first use
        self.version = -1


@dataclass
class JobWindowBatch:
    """The GpuWindow dicts of one job for one window, from one aggregator (sorted by GPU)."""

    job_id: str
    window_start_ms: int
    window_end_ms: int
    windows: list[dict[str, Any]]


def _delta(new: int, old: int) -> int:
    return new - old if new >= old else new  # a reset counter restarts at zero


class WindowAggregator:
    """Event-time window aggregation for the nodes of one partition (or, offline, all nodes).

    ``allocations`` is read, never written: the driver applies JobEvents to it before the
    samples that follow them. Times are int ms since the epoch (UTC).
    """

    def __init__(
        self,
        allocations: AllocationTable,
        window_s: int = DEFAULT_WINDOW_S,
        lateness_s: float = DEFAULT_LATENESS_S,
        idle_jobs: bool = False,
    ) -> None:
        """``idle_jobs``: aggregate readings of GPUs no job owns under the node's pseudo job
        ``idle:<node>`` (so hard errors on idle GPUs are seen) instead of dropping them."""
        if window_s <= 0 or lateness_s < 0:
            raise ValueError("window_s must be > 0 and lateness_s >= 0")
        self.allocations = allocations
        self.idle_jobs = idle_jobs
        self.window_ms = int(window_s * 1000)
        self.lateness_ms = int(lateness_s * 1000)
        self._nodes: dict[str, _Node] = {}
        self.max_ts_ms: int | None = None
        #: Every window ending at or before this has been emitted; older samples are late.
        self.closed_until_ms: int | None = None
        self.readings = 0
        self.unattributed = 0
        self.late_samples = 0
        self.xids_moved = 0
        self.xids_unattributed = 0

    @property
    def watermark_ms(self) -> int | None:
        """Highest sample time seen minus the allowed lateness (None before any sample)."""
        return None if self.max_ts_ms is None else self.max_ts_ms - self.lateness_ms

    # -- the hot path ---------------------------------------------------------------------------
    def add_batch(self, samples: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """Accumulate NodeGpuSample dicts; returns the late ones (not accumulated, counted)."""
        late: list[Mapping[str, Any]] = []
        wms = self.window_ms
        closed = self.closed_until_ms if self.closed_until_ms is not None else -(1 << 62)
        allocations, nodes = self.allocations, self._nodes
        max_ts = self.max_ts_ms if self.max_ts_ms is not None else -(1 << 62)
        readings = unattributed = 0
        for s in samples:
            ts = s["ts_ms"]
            if ts < closed:
                late.append(s)
                continue
            if ts > max_ts:
                max_ts = ts
            node_name = s["node"]
            ns = nodes.get(node_name)
            if ns is None:
                ns = nodes[node_name] = _Node()
            version = allocations.version(node_name)
            if (
                ns.version != version
                or ts < ns.seg_lo
                or (ns.seg_hi is not None and ts >= ns.seg_hi)
            ):
                ns.owners, ns.seg_lo, ns.seg_hi = allocations.segment(node_name, ts)
                ns.version = version
            owners, prevs = ns.owners, ns.prev
            wstart = ts - ts % wms
            bucket = ns.buckets.get(wstart)
            if bucket is None:
                bucket = ns.buckets[wstart] = {}
            for g in s["gpus"]:
                readings += 1
                get = g.get
                idx = g["index"]
                p = prevs.get(idx)
                if p is None:
                    p = prevs[idx] = _Prev()
                owner = owners.get(idx)
                if owner is None and self.idle_jobs:
                    owner = IDLE_JOB_PREFIX + node_name
                acc: _Acc | None = None
                if owner is not None:
                    acc = bucket.get(idx)
                    if acc is None:
                        acc = bucket[idx] = _Acc(owner, idx)
                        acc.uuid = get("uuid")
                    elif acc.job != owner:
                        acc = bucket.get((owner, idx))
                        if acc is None:
                            acc = bucket[(owner, idx)] = _Acc(owner, idx)
                            acc.uuid = get("uuid")
                    acc.n += 1
                else:
                    unattributed += 1
                if get("state") == "LOST":
                    if acc is not None:
                        acc.lost = True
                    continue  # every quantity is null; keep the counters of the last good read
                energy = get("energy_mj")
                # Throttle time = HW slowdown + SW thermal + HW thermal + power brake (any known).
                thr = None
                for v in (get("throttle_hw_slowdown_ns"), get("throttle_sw_thermal_ns"),
                          get("throttle_hw_thermal_ns"), get("throttle_hw_power_brake_ns")):  # fmt: skip
                    if v is not None:
                        thr = v if thr is None else thr + v
                cap = get("throttle_sw_power_cap_ns")
                ecc = get("ecc_volatile_uncorrected")
                nvl = None
                for v in (get("nvlink_replay_errors"), get("nvlink_recovery_errors"),
                          get("nvlink_crc_errors")):  # fmt: skip
                    if v is not None:
                        nvl = v if nvl is None else nvl + v
                pcie = get("pcie_replay_count")
                if acc is not None:
                    clk, mx = get("sm_clock_mhz"), get("sm_clock_max_mhz")
                    if clk is not None and mx:
                        acc.clk_s += clk / mx
                        acc.clk_n += 1
                    sm = get("sm_active_pct")
                    if sm is None:
                        sm = get("gpu_util_pct")
                    if sm is not None:
                        acc.sm_s += sm
                        acc.sm_n += 1
                    pw = get("power_mw")
                    if pw is not None:
                        acc.pw_s += pw
                        acc.pw_n += 1
                        lim = get("power_limit_mw")
                        if lim:
                            acc.pr_s += pw / lim
                            acc.pr_n += 1
                    t = get("temperature_c")
                    if t is not None and (acc.temp is None or t > acc.temp):
                        acc.temp = t
                    r = get("clocks_event_reasons")
                    if r is not None:
                        acc.bits_n += 1
                        if r & THROTTLE_BITS:
                            acc.thr_bits += 1
                        if r & POWER_CAP_BIT:
                            acc.cap_bits += 1
                    w = get("pcie_link_width")
                    if w is not None and (acc.wmin is None or w < acc.wmin):
                        acc.wmin = w
                    w = get("pcie_link_width_max")
                    if w is not None and (acc.wmax is None or w > acc.wmax):
                        acc.wmax = w
                    if get("remap_pending"):
                        acc.remap_p = True
                    if get("remap_failed"):
                        acc.remap_f = True
                    if ts > p.ts >= 0:
                        dt_ns = (ts - p.ts) * 1_000_000
                        if energy is not None and p.energy is not None:
                            acc.energy += _delta(energy, p.energy)
                            acc.energy_n += 1
                        if thr is not None and p.thr is not None:
                            d = thr - p.thr
                            acc.thr_ns += 0 if d < 0 else dt_ns if d > dt_ns else d
                            acc.thr_dt += dt_ns
                        if cap is not None and p.cap is not None:
                            d = cap - p.cap
                            acc.cap_ns += 0 if d < 0 else dt_ns if d > dt_ns else d
                            acc.cap_dt += dt_ns
                        if ecc is not None and p.ecc is not None and ecc != p.ecc:
                            acc.ecc += _delta(ecc, p.ecc)
                        if nvl is not None and p.nvl is not None and nvl != p.nvl:
                            acc.nvl += _delta(nvl, p.nvl)
                        if pcie is not None and p.pcie is not None and pcie != p.pcie:
                            acc.pcie += _delta(pcie, p.pcie)
                if ts > p.ts:
                    p.ts, p.energy, p.thr, p.cap = ts, energy, thr, cap
                    p.ecc, p.nvl, p.pcie = ecc, nvl, pcie
            xids = s.get("xids")
            if xids:
                self._add_xids(node_name, ts, xids, closed)
        self.readings += readings
        self.unattributed += unattributed
        self.late_samples += len(late)
        if max_ts > -(1 << 62):
            self.max_ts_ms = max_ts
        return late

    def _add_xids(self, node: str, ts: int, xids: Iterable[Mapping[str, Any]], closed: int) -> None:
        """An XID goes to the window of its own time, or of the carrying sample when that
        window is already closed (a hard error must never be lost to lateness)."""
        for x in xids:
            idx = int(x["gpu_index"])
            at = x.get("ts_ms")
            if at is None or at < closed or at > ts:
                if at is not None and at < closed:
                    self.xids_moved += 1
                at = ts
            owner = self.allocations.owner(node, idx, at)
            if owner is None and at != ts:
                at, owner = ts, self.allocations.owner(node, idx, ts)
            if owner is None and self.idle_jobs:
                owner = IDLE_JOB_PREFIX + node
            if owner is None:
                self.xids_unattributed += 1
                continue
            self._put_xid(node, at - at % self.window_ms, owner, idx, int(x["xid"]))

    def _put_xid(self, node: str, start: int, owner: str, idx: int, xid: int) -> None:
        """Append ``xid`` to the acc of (``owner``, GPU ``idx``) in ``node``'s window ``start``."""
        bucket = self._nodes[node].buckets.setdefault(start, {})
        acc = bucket.get(idx)
        if acc is not None and acc.job != owner:
            acc = bucket.get((owner, idx))
            key: Any = (owner, idx)
        else:
            key = idx
        if acc is None:
            acc = bucket[key] = _Acc(owner, idx)
        acc.xids.append(xid)

    # -- closing --------------------------------------------------------------------------------
    def close_ready(self, watermark_ms: int | None = None) -> list[JobWindowBatch]:
        """Emit every window ending at or before ``watermark_ms`` (default: :attr:`watermark_ms`),
        grouped per (job, window) and sorted by (window start, job id)."""
        if watermark_ms is None:
            watermark_ms = self.watermark_ms
            if watermark_ms is None:
                return []
        return self.group(self.pop_ready(watermark_ms))

    def pop_ready(self, watermark_ms: int) -> list[tuple[str, int, Any]]:
        """:meth:`close_ready` without building the windows: the closed ``(node, window start,
        accumulator)`` triples, for :meth:`group` (here or in another process)."""
        boundary = watermark_ms - watermark_ms % self.window_ms
        if self.closed_until_ms is None or boundary > self.closed_until_ms:
            self.closed_until_ms = boundary
        return list(self._pop(watermark_ms))

    def flush(self) -> list[JobWindowBatch]:
        """Emit every open window (end of input); later samples of those windows are late."""
        return self.group(self.pop_all())

    def pop_all(self) -> list[tuple[str, int, Any]]:
        """:meth:`flush` without building the windows (see :meth:`pop_ready`)."""
        if self.max_ts_ms is not None:
            end = self.max_ts_ms - self.max_ts_ms % self.window_ms + self.window_ms
            self.closed_until_ms = max(self.closed_until_ms or end, end)
        return list(self._pop(None))

    def _pop(self, watermark_ms: int | None) -> Iterator[tuple[str, int, Any]]:
        """Remove and yield ``(node, window start, acc)`` of every window ending at or before
        ``watermark_ms`` (None: every open window)."""
        for node in sorted(self._nodes):
            ns = self._nodes[node]
            for start in sorted(ns.buckets):
                if watermark_ms is None or start + self.window_ms <= watermark_ms:
                    for acc in ns.buckets.pop(start).values():
                        yield node, start, acc

    def group(self, closed: Iterable[tuple[str, int, Any]]) -> list[JobWindowBatch]:
        """The GpuWindow dicts of closed ``(node, window start, accumulator)`` triples, grouped
        per (job, window) and sorted by (window start, job id), each group by (node, GPU)."""
        grouped: dict[tuple[int, str], list[dict[str, Any]]] = {}
        for node, start, acc in closed:
            grouped.setdefault((start, acc.job), []).append(self._window(acc, node, start))
        wms = self.window_ms
        return [
            JobWindowBatch(
                job, start, start + wms, sorted(ws, key=lambda w: (w["node"], w["gpu_index"]))
            )
            for (start, job), ws in sorted(grouped.items())
        ]

    def _window(self, acc: _Acc, node: str, start: int) -> dict[str, Any]:
        """The GpuWindow dict of one accumulator (fields the hot path cannot know stay null)."""
        meta = self.allocations.job(acc.job)
        thr: float | None = None
        cap: float | None = None
        if acc.thr_dt:
            thr = acc.thr_ns / acc.thr_dt
        elif acc.bits_n:
            thr = acc.thr_bits / acc.bits_n
        if acc.cap_dt:
            cap = acc.cap_ns / acc.cap_dt
        elif acc.bits_n:
            cap = acc.cap_bits / acc.bits_n
        return {
            "job_id": acc.job,
            "node": node,
            "gpu_index": acc.idx,
            "gpu_uuid": acc.uuid,
            "window_start_ms": start,
            "window_end_ms": start + self.window_ms,
            "samples": acc.n,
            "user": meta.user if meta else None,
            "partition": meta.partition if meta else None,
            "account": meta.account if meta else None,
            "clk_ratio": acc.clk_s / acc.clk_n if acc.clk_n else None,
            "throttle_frac": thr,
            "power_cap_frac": cap,
            "sm_frac": acc.sm_s / acc.sm_n / 100.0 if acc.sm_n else None,
            "power_ratio": acc.pr_s / acc.pr_n if acc.pr_n else None,
            "power_w": acc.pw_s / acc.pw_n / 1000.0 if acc.pw_n else None,
            "temperature_c_max": acc.temp,
            "energy_j": acc.energy / 1000.0 if acc.energy_n else None,
            "ecc_uncorrected_delta": acc.ecc,
            "nvlink_errors_delta": acc.nvl,
            "pcie_replay_delta": acc.pcie,
            "pcie_link_width_min": acc.wmin,
            "pcie_link_width_max": acc.wmax,
            "remap_pending": acc.remap_p,
            "remap_failed": acc.remap_f,
            "lost": acc.lost,
            "xids": sorted(set(acc.xids)),
            "step_ms": None,
            "score": None,
            "gated": None,
        }

    # -- state ----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly state (open windows, counter memory, clocks); not the allocations."""
        nodes: dict[str, Any] = {}
        for name, ns in sorted(self._nodes.items()):
            nodes[name] = {
                "buckets": {
                    str(start): [[getattr(a, f) for f in _ACC_FIELDS] for a in b.values()]
                    for start, b in sorted(ns.buckets.items())
                },
                "prev": {str(i): [getattr(p, f) for f in _PREV_FIELDS] for i, p in ns.prev.items()},
            }
        return {
            "window_ms": self.window_ms,
            "lateness_ms": self.lateness_ms,
            "max_ts_ms": self.max_ts_ms,
            "closed_until_ms": self.closed_until_ms,
            "counters": self.counters(),
            "nodes": nodes,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], allocations: AllocationTable) -> WindowAggregator:
        out = cls(allocations, int(data["window_ms"]) // 1000, int(data["lateness_ms"]) / 1000)
        out.window_ms, out.lateness_ms = int(data["window_ms"]), int(data["lateness_ms"])
        out.max_ts_ms, out.closed_until_ms = data.get("max_ts_ms"), data.get("closed_until_ms")
        for name, value in (data.get("counters") or {}).items():
            setattr(out, name, int(value))
        for name, nd in (data.get("nodes") or {}).items():
            ns = out._nodes[name] = _Node()
            for start, accs in nd["buckets"].items():
                bucket = ns.buckets[int(start)] = {}
                for values in accs:
                    acc = _Acc(values[0])
                    for f, v in zip(_ACC_FIELDS, values, strict=True):
                        setattr(acc, f, list(v) if f == "xids" else v)
                    key: Any = acc.idx if acc.idx not in bucket else (acc.job, acc.idx)
                    bucket[key] = acc
            for idx, values in nd["prev"].items():
                p = ns.prev[int(idx)] = _Prev()
                for f, v in zip(_PREV_FIELDS, values, strict=True):
                    setattr(p, f, v)
        return out

    def counters(self) -> dict[str, int]:
        """Readings seen, unattributed (no owner), late samples, XIDs moved or unattributed."""
        return {
            "readings": self.readings,
            "unattributed": self.unattributed,
            "late_samples": self.late_samples,
            "xids_moved": self.xids_moved,
            "xids_unattributed": self.xids_unattributed,
        }
