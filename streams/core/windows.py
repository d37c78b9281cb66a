"""Stage 2, the hot path: attribute GPU readings to jobs and pre-aggregate event-time windows.

One implementation for the live hot stage, replay and the evaluation. :class:`WindowAggregator`
takes BATCHES of NodeGpuSample records as columns (:mod:`peerwatch.schemas.columns`: the C
decoder fills them straight from Avro bytes, :meth:`WindowAggregator.add_batch` from decoded
dicts) and does its work per batch with numpy, so its cost per GPU reading is a few vector
operations rather than Python statements. Each GPU reading is attributed to the job that owned
the GPU at the sample's ``ts_ms`` (:class:`~peerwatch.streams.core.allocation.AllocationTable`)
and accumulated per (job, node, GPU, window) for windows of ``window_s`` aligned to the epoch.
Readings of GPUs no job owns go to the node's pseudo job ``idle:<node>`` (``idle_jobs``) or are
counted and dropped.

Time: the watermark is the highest sample time seen minus ``lateness_s`` (the setting ``stream.lateness_s``, 5 s: node
clocks are skewed by 1-2 s and agents publish at their tick). :meth:`close_ready` emits every
window whose end is at or before the watermark, grouped per (job, window). A sample older than
the last closed window boundary is *late*: it is not accumulated, it is counted and returned so
the driver can send it on; it is never silently dropped. A sample whose time is outside
``[0, 2**53)`` ms is *invalid*: counted and returned likewise.

Counters (energy, throttle time, ECC, NVLink, PCIe replay) become deltas between consecutive
samples of the same GPU (the previous one is the latest earlier sample of that GPU, in any job,
whose time moved the GPU's clock forward); a delta belongs to the window of the later sample. A
counter that went down was reset (driver reload): the new value is the increase since then. A
counter value outside ``[0, 2**53)`` is treated as missing (counted as ``bad_values``).

Results do not depend on how the input is cut into batches: sums of floats are taken in the
order the readings arrived, each window's running sum first (``np.bincount`` adds in index
order), so a window is the same to the last bit whether its readings came in one batch or many.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import setitem
from typing import Any, NamedTuple

import numpy as np

from peerwatch.schemas.columns import Table, table_spec, tables_from_records
from peerwatch.schemas.registry import raw_schema, strip_logical_types
from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.gpu_runs import (
    GpuKeys,
    GrowingRows,
    counter_delta,
    gpu_code_key,
    gpu_runs,
)
from peerwatch.streams.core.model import IDLE_JOB_PREFIX
from peerwatch.streams.core.settings import DetectorSettings, StreamSettings

#: Clocks-event reasons that count as throttling: HW slowdown, SW thermal, HW thermal, brake.
THROTTLE_BITS = 0x8 | 0x20 | 0x40 | 0x80
#: SW power cap, kept apart from throttling.
POWER_CAP_BIT = 0x4
#: The throttling reasons a named cause needs apart: SW/HW thermal, and the HW power brake.
THERMAL_BITS = 0x20 | 0x40
POWER_BRAKE_BIT = 0x80
#: The settings tree's defaults (``detector.window_s``, ``stream.lateness_s``).
DEFAULT_WINDOW_S = DetectorSettings().window_s
DEFAULT_LATENESS_S = StreamSettings().lateness_s
#: Sample times and counter values must lie in [0, this).
VALUE_LIMIT = 1 << 53
#: A gap between two samples counts at most this long in throttle-time denominators (~99 days).
MAX_GAP_MS = 1 << 33
_FAR_PAST = -(1 << 62)
_NONE_MAX = np.iinfo(np.int64).min  # "no value yet" of running maxima
_NONE_MIN = np.iinfo(np.int64).max  # of running minima

THROTTLE_FIELDS = ("throttle_hw_slowdown_ns", "throttle_sw_thermal_ns", "throttle_hw_thermal_ns",
                   "throttle_hw_power_brake_ns")  # fmt: skip
THERMAL_FIELDS = ("throttle_sw_thermal_ns", "throttle_hw_thermal_ns")
NVLINK_FIELDS = ("nvlink_replay_errors", "nvlink_recovery_errors", "nvlink_crc_errors")
COUNTER_FIELDS = ("energy_mj", "throttle_sw_power_cap_ns", "ecc_volatile_uncorrected",
                  "pcie_replay_count", *THROTTLE_FIELDS, *NVLINK_FIELDS)  # fmt: skip
_GPU_FIELDS = ("index", "uuid", "state", "sm_clock_mhz", "sm_clock_max_mhz", "clocks_event_reasons",
               "power_mw", "power_limit_mw", "temperature_c", "gpu_util_pct", "sm_active_pct",
               "remap_pending", "remap_failed", "pcie_link_width", "pcie_link_width_max",
               *COUNTER_FIELDS)  # fmt: skip
#: The NodeGpuSample fields stage 2 reads (the columns the decoders fill).
SELECTION: dict[str, Any] = {
    "node": True,
    "ts_ms": True,
    "gpus": dict.fromkeys(_GPU_FIELDS, True),
    "xids": {"gpu_index": True, "xid": True, "ts_ms": True},
}
SAMPLE_SPEC = table_spec(strip_logical_types(raw_schema("NodeGpuSample")), SELECTION)
_LOST = SAMPLE_SPEC.children[0][1].columns[2].symbols.index("LOST")  # type: ignore[union-attr]

#: Per-slot accumulators: int64 sums and counts, float64 sums, and running max/min/flags.
_INT_ACCS = ("n", "clk_n", "sm_n", "pw_n", "pr_n", "energy", "energy_n", "thr_ns", "thr_dt",
             "cap_ns", "cap_dt", "bits_n", "thr_bits", "cap_bits", "ecc", "nvl", "pcie",
             "thm_ns", "thm_dt", "brk_ns", "brk_dt", "thm_bits", "brk_bits")  # fmt: skip
_FLOAT_ACCS = ("clk_s", "sm_s", "pw_s", "pr_s")
_MAX_ACCS = ("temp", "wmax", "remap_p", "remap_f", "lost")
_MIN_ACCS = ("wmin",)
#: Per-GPU memory of the last sample that moved its clock forward (for counter deltas).
_PREV = ("energy", "thr", "cap", "ecc", "nvl", "pcie", "thm", "brk")
#: Throttle-time counters: each becomes a share of the time between samples.
_TIMED = frozenset({"thr", "cap", "thm", "brk"})


@dataclass
class JobWindowBatch:
    """The GpuWindow dicts of one job for one window, from one aggregator (sorted by GPU)."""

    job_id: str
    window_start_ms: int
    window_end_ms: int
    windows: list[dict[str, Any]]


@dataclass
class BatchResult:
    """What :meth:`WindowAggregator.add_columns` did not accumulate: row numbers of late and of
    invalid samples (the driver dead-letters them)."""

    late: np.ndarray
    invalid: np.ndarray


class ClosedWindows(NamedTuple):
    """The slots of one closed window start, all jobs, as columns (:meth:`windows` makes the
    GpuWindow dicts). Numpy arrays and small tables: a split replay's reading process sends
    these (:meth:`portable`) and its other process makes the dicts."""

    start_ms: int
    end_ms: int
    #: the bucket's accumulators, one row per slot (see ``_Bucket``)
    accs: Mapping[str, np.ndarray]
    node: np.ndarray  # node code of each slot
    gpu_index: np.ndarray  # GPU index of each slot
    #: the string of a node or UUID code: the aggregator's list, or the codes used (portable)
    names: Sequence[str] | Mapping[int, str]
    #: job code -> (job id, user, partition, account)
    jobs: Mapping[int, tuple[str, str | None, str | None, str | None]]
    xids: Mapping[int, list[int]]  # slot -> XIDs seen in it

    def portable(self) -> ClosedWindows:
        """The same windows holding only the strings they use (not the aggregator's list of
        every node and UUID seen)."""
        uuids = self.accs["uuid"]
        used = np.unique(np.concatenate([self.node, uuids[uuids >= 0]])).tolist()
        names = self.names
        return self._replace(names={c: names[c] for c in used})

    def windows(self) -> list[tuple[str, dict[str, Any]]]:
        """``(job id, GpuWindow dict)`` of every slot (fields the hot path cannot know: null).

        Every derived value is computed per column (the same float operations, in the same
        order, as one window at a time would do); only building the dicts is per window."""
        a = self.accs
        n = len(a["gid"])
        names = self.names
        job_codes = a["job"].tolist()
        metas = self.jobs
        jobs = [metas[c][0] for c in job_codes]
        uuids = a["uuid"].tolist()
        temp, wmin, wmax = a["temp"], a["wmin"], a["wmax"]
        columns: dict[str, Any] = {  # a list per window, or one value for all
            "job_id": jobs,
            "node": [names[c] for c in self.node.tolist()],
            "gpu_index": self.gpu_index.tolist(),
            "gpu_uuid": [names[u] if u >= 0 else None for u in uuids],
            "window_start_ms": self.start_ms,
            "window_end_ms": self.end_ms,
            "samples": a["n"].tolist(),
            "user": [metas[c][1] for c in job_codes],
            "partition": [metas[c][2] for c in job_codes],
            "account": [metas[c][3] for c in job_codes],
            "clk_ratio": _ratio(a["clk_s"], a["clk_n"]),
            "throttle_frac": _shares(a, "thr"),
            "power_cap_frac": _shares(a, "cap"),
            "sm_frac": _ratio(a["sm_s"], a["sm_n"], 100.0),
            "power_ratio": _ratio(a["pr_s"], a["pr_n"]),
            "power_w": _ratio(a["pw_s"], a["pw_n"], 1000.0),
            "temperature_c_max": _present(temp, temp != _NONE_MAX),
            "energy_j": _present(a["energy"] / 1000.0, a["energy_n"] != 0),
            "ecc_uncorrected_delta": a["ecc"].tolist(),
            "nvlink_errors_delta": a["nvl"].tolist(),
            "pcie_replay_delta": a["pcie"].tolist(),
            "pcie_link_width_min": _present(wmin, wmin != _NONE_MIN),
            "pcie_link_width_max": _present(wmax, wmax != _NONE_MAX),
            "remap_pending": (a["remap_p"] > 0).tolist(),
            "remap_failed": (a["remap_f"] > 0).tolist(),
            "lost": (a["lost"] > 0).tolist(),
            "xids": [sorted(set(self.xids[i])) if i in self.xids else [] for i in range(n)],
            "step_ms": None,
            "score": None,
            "gated": None,
            "thermal_frac": _shares(a, "thm"),
            "power_brake_frac": _shares(a, "brk"),
            "fleet_clk_ratio": None,
        }
        # a copy of one dict holding every field in order (the same values where every window
        # has the same), then the other fields column by column: half the cost of a dict made
        # of each window's row
        template = {k: None if isinstance(v, list) else v for k, v in columns.items()}
        windows = [template.copy() for _ in range(n)]
        for name, values in columns.items():
            if isinstance(values, list):  # w[name] = v for each window, the loop in C
                deque(map(setitem, windows, repeat(name, n), values), 0)
        return list(zip(jobs, windows, strict=True))


class _Bucket:
    """The accumulators of one window start, all nodes: one slot per (GPU, job)."""

    def __init__(self) -> None:
        acc_fill = dict.fromkeys(_INT_ACCS, 0)
        acc_fill.update(dict.fromkeys(_MAX_ACCS, _NONE_MAX))
        acc_fill.update(dict.fromkeys(_MIN_ACCS, _NONE_MIN))
        acc_fill.update(gid=-1, job=-1, uuid=-1, seq=0)
        self.accs = GrowingRows(acc_fill, _FLOAT_ACCS)
        self.slot_of_gid = np.full(0, -1, np.int64)  # the GPU's first (usual) slot
        self.extra: dict[tuple[int, int], int] = {}  # (gid, job) -> slot of another job
        self.xids: dict[int, list[int]] = {}

    def slots(self, gid: np.ndarray, job: np.ndarray, seq: np.ndarray, uuid: np.ndarray,
              n_gids: int) -> np.ndarray:  # fmt: skip
        """The slot of each (gid, job) reading, created where missing (in reading order)."""
        if len(self.slot_of_gid) < n_gids:
            grown = np.full(max(n_gids, 2 * len(self.slot_of_gid)), -1, np.int64)
            grown[: len(self.slot_of_gid)] = self.slot_of_gid
            self.slot_of_gid = grown
        a = self.accs.arrays
        slot: np.ndarray = self.slot_of_gid[gid]
        new = slot < 0
        if new.any():
            first_gid, first = np.unique(gid[new], return_index=True)
            rows = np.flatnonzero(new)[first]
            start = self.accs.add(len(rows))
            a = self.accs.arrays
            made = np.arange(start, start + len(rows))
            self.slot_of_gid[first_gid] = made
            a["gid"][made], a["job"][made] = first_gid, job[rows]
            a["uuid"][made], a["seq"][made] = uuid[rows], seq[rows]
            slot = self.slot_of_gid[gid]
        other = a["job"][slot] != job
        for i in np.flatnonzero(other).tolist():  # a GPU that changed owner inside the window
            key = (int(gid[i]), int(job[i]))
            s = self.extra.get(key)
            if s is None:
                s = self.extra[key] = self.accs.add(1)
                a = self.accs.arrays
                a["gid"][s], a["job"][s], a["uuid"][s], a["seq"][s] = (
                    key[0],
                    key[1],
                    uuid[i],
                    seq[i],
                )
            slot[i] = s
        return slot

    def slot_for_xid(self, gid: int, job: int, seq: int, n_gids: int) -> int:
        """The slot an XID of sample ``seq`` goes to; created (without a UUID) where missing. A
        slot first read by a later sample than ``seq`` was, in arrival order, created by this
        XID: it loses the UUID the reading gave it."""
        e = np.asarray([gid]), np.asarray([job]), np.asarray([seq]), np.asarray([-1])
        s = int(self.slots(*e, n_gids)[0])
        a = self.accs.arrays
        if a["seq"][s] > seq:
            a["uuid"][s], a["seq"][s] = -1, seq
        return s


def _present(values: np.ndarray, present: np.ndarray) -> list[Any]:
    """``values`` as Python numbers, None where not ``present``."""
    out = values.astype(object)
    out[~present] = None
    result: list[Any] = out.tolist()
    return result


def _ratio(total: np.ndarray, count: np.ndarray, scale: float | None = None) -> list[Any]:
    """``total / count`` (then ``/ scale``) per slot, None where ``count`` is 0."""
    some = count != 0
    mean = np.divide(total, count, out=np.zeros(len(total)), where=some)
    if scale is not None:
        mean = mean / scale
    return _present(mean, some)


def _shares(a: Mapping[str, np.ndarray], name: str) -> list[Any]:
    """Share of each slot's time under one throttle reason: from its counter when the counter
    moved time on, else from the reason bits sampled each tick, else None."""
    timed = a[f"{name}_dt"] != 0
    sampled = a["bits_n"] != 0
    by_time = np.divide(a[f"{name}_ns"], a[f"{name}_dt"], out=np.zeros(len(timed)), where=timed)
    by_bits = np.divide(a[f"{name}_bits"], a["bits_n"], out=np.zeros(len(timed)), where=sampled)
    return _present(np.where(timed, by_time, by_bits), timed | sampled)


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
        self.max_ts_ms: int | None = None
        #: Every window ending at or before this has been emitted; older samples are late.
        self.closed_until_ms: int | None = None
        #: Codes of the strings in the columns (node names, UUIDs): give it to the decoder.
        self.strings: dict[str, int] = {}
        self._names: list[str] = []
        self._jobs: dict[str, int] = {}
        self._job_names: list[str] = []
        # per node code: cached owner segment (allocation version, [lo, hi)) and owners
        self._node = GrowingRows({"version": -1, "lo": 0, "hi": -1, "idle": -1})
        self._node_owners: dict[int, dict[int, str]] = {}
        self._node_gids: dict[int, list[int]] = {}
        self._generation = -1
        # per GPU (gid): node code, index, owner under the node's cached segment, counter memory
        self._gid_of = GpuKeys()
        prev_fill = {"node": 0, "index": 0, "owner": -1, "ts": -1}
        prev_fill.update({f"p_{k}": 0 for k in _PREV})
        prev_fill.update({f"v_{k}": 0 for k in _PREV})
        self._gpu = GrowingRows(prev_fill)
        self._buckets: dict[int, _Bucket] = {}
        self._seq = 0  # samples seen, for the arrival order of XIDs against readings
        self.readings = 0
        self.unattributed = 0
        self.late_samples = 0
        self.invalid_samples = 0
        self.bad_values = 0
        self.xids_moved = 0
        self.xids_unattributed = 0

    @property
    def watermark_ms(self) -> int | None:
        """Highest sample time seen minus the allowed lateness (None before any sample)."""
        return None if self.max_ts_ms is None else self.max_ts_ms - self.lateness_ms

    # -- input ----------------------------------------------------------------------------------
    def add_batch(self, samples: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        """Accumulate decoded NodeGpuSample dicts; returns the late and invalid ones (not
        accumulated, counted)."""
        if not samples:
            return []
        result = self.add_columns(tables_from_records(SAMPLE_SPEC, samples, self.strings))
        refused = np.sort(np.concatenate([result.late, result.invalid]))
        return [samples[i] for i in refused.tolist()]

    def name(self, code: int) -> str:
        """The string of a code of :attr:`strings` (a node name, a UUID)."""
        self._sync_names()
        return self._names[code]

    def names(self) -> list[str]:
        """Every string of :attr:`strings`, by code (the list itself: do not change it)."""
        self._sync_names()
        return self._names

    def _job_code(self, job_id: str) -> int:
        code = self._jobs.get(job_id)
        if code is None:
            code = self._jobs[job_id] = len(self._job_names)
            self._job_names.append(job_id)
        return code

    def _sync_names(self) -> None:
        if len(self._names) < len(self.strings):
            self._names.extend(list(self.strings)[len(self._names) :])
        if self._node.size < len(self._names):
            self._node.add(len(self._names) - self._node.size)

    def _gids(self, node: np.ndarray, index: np.ndarray) -> np.ndarray:
        """The GPU id of each (node code, GPU index), new ids made for GPUs not seen before."""
        return self._gid_of.lookup(gpu_code_key(node, index), self._new_gids)

    def _new_gids(self, new_keys: np.ndarray) -> np.ndarray:
        """Ids for GPUs not seen before (their keys, sorted): node, index and owner set."""
        first = self._gpu.add(len(new_keys))
        g = self._gpu.arrays
        ids = np.arange(first, first + len(new_keys))
        g["node"][ids] = new_keys >> 32
        idx = (new_keys & 0xFFFFFFFF).astype(np.int64)
        g["index"][ids] = np.where(idx >= 1 << 31, idx - (1 << 32), idx)
        for gid, nc, ix in zip(ids.tolist(), g["node"][ids].tolist(), g["index"][ids].tolist(),
                               strict=True):  # fmt: skip
            self._node_gids.setdefault(nc, []).append(gid)
            g["owner"][gid] = self._owner_code(nc, self._node_owners.get(nc, {}).get(ix))
        return ids

    def _owner_code(self, node: int, job_id: str | None) -> int:
        if job_id is not None:
            return self._job_code(job_id)
        if not self.idle_jobs:
            return -1
        code = int(self._node.arrays["idle"][node])
        if code < 0:
            code = self._job_code(IDLE_JOB_PREFIX + self._names[node])
            self._node.arrays["idle"][node] = code
        return code

    def _cache_segment(self, node: int, ts: int) -> dict[int, str]:
        """Look up and cache the owners of ``node`` at ``ts``; the node's GPUs' owners follow."""
        name = self._names[node]
        owners, lo, hi = self.allocations.segment(name, ts)
        a = self._node.arrays
        a["version"][node] = self.allocations.version(name)
        a["lo"][node], a["hi"][node] = lo, (1 << 62) if hi is None else hi
        self._node_owners[node] = owners
        g = self._gpu.arrays
        for gid in self._node_gids.get(node, ()):
            g["owner"][gid] = self._owner_code(node, owners.get(int(g["index"][gid])))
        return owners

    def add_columns(self, tables: Mapping[str, Table]) -> BatchResult:
        """Accumulate one batch of NodeGpuSample columns (:data:`SAMPLE_SPEC`, string codes
        from :attr:`strings`)."""
        top, gpus, xids = tables[""], tables["gpus."], tables["xids."]
        self._sync_names()
        node, ts = top.values["node"], top.values["ts_ms"]
        closed = self.closed_until_ms if self.closed_until_ms is not None else _FAR_PAST
        invalid = (ts < 0) | (ts >= VALUE_LIMIT)
        late = ~invalid & (ts < closed)
        keep = ~(invalid | late)
        seq = self._seq + np.arange(top.n, dtype=np.int64)
        self._seq += top.n
        self.late_samples += int(late.sum())
        self.invalid_samples += int(invalid.sum())
        result = BatchResult(np.flatnonzero(late), np.flatnonzero(invalid))
        if not keep.any():
            return result
        kept_ts = ts[keep]
        self.max_ts_ms = max(self.max_ts_ms if self.max_ts_ms is not None else _FAR_PAST,
                             int(kept_ts.max()))  # fmt: skip

        # Owners: each sample's node segment, cached per node; samples outside it are looked up.
        if self.allocations.generation != self._generation:  # some node's intervals changed
            self._generation = self.allocations.generation
            a = self._node.arrays
            for nc in np.flatnonzero(a["version"][: self._node.size] >= 0).tolist():
                if a["version"][nc] != self.allocations.version(self._names[nc]):
                    a["version"][nc] = -1
        a = self._node.arrays
        cached = keep & (a["version"][node] >= 0) & (ts >= a["lo"][node]) & (ts < a["hi"][node])

        assert gpus.parent is not None
        rows = np.flatnonzero(keep[gpus.parent]) if gpus.n else np.empty(0, np.int64)
        parent = gpus.parent[rows] if gpus.n else rows
        index = gpus.values["index"][rows]
        gid = self._gids(node[parent], index)
        job = self._gpu.arrays["owner"][gid]  # under each node's segment as cached before
        for s in np.flatnonzero(keep & ~cached).tolist():  # new segment: look up, in order
            nc, t = int(node[s]), int(ts[s])
            if not (a["version"][nc] >= 0 and a["lo"][nc] <= t < a["hi"][nc]):
                self._cache_segment(nc, t)
                a = self._node.arrays
            mine = np.flatnonzero(parent == s)
            job[mine] = self._gpu.arrays["owner"][gid[mine]]
        self.readings += len(rows)
        self.unattributed += int((job < 0).sum())

        self._aggregate(gpus, rows, parent, gid, job, ts, seq)
        if xids.n:
            self._add_xids(xids, keep, node, ts, seq, closed)
        return result

    def _aggregate(self, gpus: Table, rows: np.ndarray, parent: np.ndarray, gid: np.ndarray,
                   job: np.ndarray, ts: np.ndarray, seq: np.ndarray) -> None:  # fmt: skip
        """Counter deltas and window sums of the kept readings ``rows`` of ``gpus``."""
        v, ok = gpus.values, gpus.valid

        def col(name: str) -> tuple[np.ndarray, np.ndarray]:
            return v[name][rows], ok[name][rows]

        lost = v["state"][rows] == _LOST
        counters: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for name in COUNTER_FIELDS:
            x, good = col(name)
            bad = good & ((x < 0) | (x >= VALUE_LIMIT))
            if bad.any():
                self.bad_values += int(bad.sum())
                good = good & ~bad
            counters[name] = (x, good)

        def total(names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
            parts = [counters[n] for n in names]
            present = np.logical_or.reduce([g for _, g in parts])
            return sum(np.where(g, x, 0) for x, g in parts), present  # type: ignore[return-value]

        now = {"energy": counters["energy_mj"], "thr": total(THROTTLE_FIELDS),
               "cap": counters["throttle_sw_power_cap_ns"],
               "ecc": counters["ecc_volatile_uncorrected"],
               "nvl": total(NVLINK_FIELDS), "pcie": counters["pcie_replay_count"],
               "thm": total(THERMAL_FIELDS),
               "brk": counters["throttle_hw_power_brake_ns"]}  # fmt: skip
        t = ts[parent]
        deltas = self._deltas(
            gid[~lost], t[~lost], {k: (x[~lost], g[~lost]) for k, (x, g) in now.items()}
        )

        attributed = job >= 0
        wstart = t - t % self.window_ms
        n_gids = self._gpu.size
        uuid = v["uuid"][rows]
        live = np.flatnonzero(~lost)
        for start in np.unique(wstart[attributed]).tolist():
            sel = np.flatnonzero(attributed & (wstart == start))
            bucket = self._buckets.get(start)
            if bucket is None:
                bucket = self._buckets[start] = _Bucket()
            slot = bucket.slots(gid[sel], job[sel], seq[parent[sel]], uuid[sel], n_gids)
            acc = bucket.accs
            self._add_counts(acc.arrays, slot, sel, lost, v, ok, rows)
            self._add_floats(acc.arrays, slot, sel, lost, v, ok, rows)
            # deltas of the readings of this window (they are indexed over the non-lost ones)
            in_window = np.isin(live, sel, assume_unique=True)
            if in_window.any():
                dslot = np.full(len(rows), -1, np.int64)
                dslot[sel] = slot
                ds = dslot[live[in_window]]
                for name, (amount, counted) in deltas.items():
                    m = counted[in_window]
                    np.add.at(acc.arrays[name], ds[m], amount[in_window][m])

    def _deltas(self, gid: np.ndarray, t: np.ndarray,
                now: Mapping[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:  # fmt: skip
        """Per non-lost reading (in order), the counter deltas it adds to its window, and the
        GPUs' counter memory moved on. Returns accumulator name -> (amount, counted mask)."""
        m = len(gid)
        g = self._gpu.arrays
        empty = {k: (np.zeros(m, np.int64), np.zeros(m, np.bool_)) for k in
                 ("energy", "energy_n", "thr_ns", "thr_dt", "cap_ns", "cap_dt", "ecc", "nvl", "pcie",
                  "thm_ns", "thm_dt", "brk_ns", "brk_dt")}  # fmt: skip
        if m == 0:
            return empty
        runs = gpu_runs(gid, t, g["ts"])
        groups, head_pos, size, ts_a = runs.groups, runs.head_pos, runs.size, runs.ts
        # each element's latest element that moved the clock (itself, when it did)
        elements = np.arange(size)
        last = (
            elements if runs.in_order else np.maximum.accumulate(np.where(runs.moves, elements, 0))
        )
        prev = np.empty(size, np.int64)
        prev[1:] = last[:-1]

        out = dict(empty)
        p = np.empty(m, np.int64)  # element of each reading, in reading order
        p[runs.order] = runs.pos
        adv = runs.moves[p]
        pp = prev[p]
        p_ts = ts_a[pp]
        counted = adv & (p_ts >= 0)
        dt_ns = np.minimum(t - p_ts, MAX_GAP_MS) * 1_000_000
        values: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for k in _PREV:
            x, good = now[k]
            xa = np.empty(size, np.int64)
            ga = np.empty(size, np.bool_)
            xa[p], ga[p] = x, good
            xa[head_pos], ga[head_pos] = g[f"p_{k}"][groups], g[f"v_{k}"][groups].astype(np.bool_)
            values[k] = (xa, ga)
            both = counted & good & ga[pp]
            old = xa[pp]
            if k == "energy":
                out["energy"] = (counter_delta(x, old), both)
                out["energy_n"] = (np.ones(m, np.int64), both)
            elif k in _TIMED:
                out[f"{k}_ns"] = (np.clip(x - old, 0, dt_ns), both)
                out[f"{k}_dt"] = (dt_ns, both)
            else:
                out[k] = (counter_delta(x, old), both & (x != old))
        # memory: each group's last element that moved the clock
        ends = np.r_[head_pos[1:], size] - 1
        final = last[ends]
        g["ts"][groups] = ts_a[final]
        for k in _PREV:
            xa, ga = values[k]
            g[f"p_{k}"][groups], g[f"v_{k}"][groups] = xa[final], ga[final]
        return out

    @staticmethod
    def _add_counts(a: dict[str, np.ndarray], slot: np.ndarray, sel: np.ndarray, lost: np.ndarray,
                    v: Mapping[str, np.ndarray], ok: Mapping[str, np.ndarray], rows: np.ndarray) -> None:  # fmt: skip
        np.add.at(a["n"], slot, 1)
        is_lost = lost[sel]
        np.maximum.at(a["lost"], slot[is_lost], 1)
        good = ~is_lost
        s = slot[good]
        r = rows[sel][good]
        t, tv = v["temperature_c"][r], ok["temperature_c"][r]
        np.maximum.at(a["temp"], s[tv], t[tv])
        bits, bv = v["clocks_event_reasons"][r], ok["clocks_event_reasons"][r]
        np.add.at(a["bits_n"], s[bv], 1)
        np.add.at(a["thr_bits"], s[bv & ((bits & THROTTLE_BITS) != 0)], 1)
        np.add.at(a["cap_bits"], s[bv & ((bits & POWER_CAP_BIT) != 0)], 1)
        np.add.at(a["thm_bits"], s[bv & ((bits & THERMAL_BITS) != 0)], 1)
        np.add.at(a["brk_bits"], s[bv & ((bits & POWER_BRAKE_BIT) != 0)], 1)
        w, wv = v["pcie_link_width"][r], ok["pcie_link_width"][r]
        np.minimum.at(a["wmin"], s[wv], w[wv])
        w, wv = v["pcie_link_width_max"][r], ok["pcie_link_width_max"][r]
        np.maximum.at(a["wmax"], s[wv], w[wv])
        for name, acc in (("remap_pending", "remap_p"), ("remap_failed", "remap_f")):
            on = ok[name][r] & (v[name][r] != 0)
            np.maximum.at(a[acc], s[on], 1)

    @staticmethod
    def _add_floats(a: dict[str, np.ndarray], slot: np.ndarray, sel: np.ndarray, lost: np.ndarray,
                    v: Mapping[str, np.ndarray], ok: Mapping[str, np.ndarray], rows: np.ndarray) -> None:  # fmt: skip
        """Float sums in arrival order, each slot's running sum first (bit-exact whatever the
        batching: ``np.bincount`` adds its weights in index order)."""
        good = ~lost[sel]
        s = slot[good]
        r = rows[sel][good]
        touched, inv = np.unique(s, return_inverse=True)
        k = len(touched)
        lead = np.arange(k)

        def add(total: str, count: str, x: np.ndarray, m: np.ndarray) -> None:
            if not m.any():
                return
            w = np.concatenate([a[total][touched], x[m].astype(np.float64)])
            idx = np.concatenate([lead, inv[m]])
            a[total][touched] = np.bincount(idx, weights=w, minlength=k)
            np.add.at(a[count], s[m], 1)

        clk, cv = v["sm_clock_mhz"][r], ok["sm_clock_mhz"][r]
        mx, mv = v["sm_clock_max_mhz"][r], ok["sm_clock_max_mhz"][r]
        m = cv & mv & (mx != 0)
        add("clk_s", "clk_n", np.divide(clk, mx, where=m, out=np.zeros(len(r))), m)
        sm_a, sa = v["sm_active_pct"][r], ok["sm_active_pct"][r]
        util, uv = v["gpu_util_pct"][r], ok["gpu_util_pct"][r]
        add("sm_s", "sm_n", np.where(sa, sm_a, util.astype(np.float64)), sa | uv)
        pw, pv = v["power_mw"][r], ok["power_mw"][r]
        add("pw_s", "pw_n", pw, pv)
        lim, lv = v["power_limit_mw"][r], ok["power_limit_mw"][r]
        m = pv & lv & (lim != 0)
        add("pr_s", "pr_n", np.divide(pw, lim, where=m, out=np.zeros(len(r))), m)

    def _add_xids(self, xids: Table, keep: np.ndarray, node: np.ndarray, ts: np.ndarray,
                  seq: np.ndarray, closed: int) -> None:  # fmt: skip
        """An XID goes to the window of its own time, or of the carrying sample when that
        window is already closed (a hard error must never be lost to lateness)."""
        assert xids.parent is not None
        at_ok = xids.valid.get("ts_ms")
        for i in np.flatnonzero(keep[xids.parent]).tolist():
            s = int(xids.parent[i])
            nc, t = int(node[s]), int(ts[s])
            name = self._names[nc]
            idx = int(xids.values["gpu_index"][i])
            at: int | None = int(xids.values["ts_ms"][i])
            if at_ok is not None and not at_ok[i]:
                at = None
            if at is None or at < closed or at > t:
                if at is not None and at < closed:
                    self.xids_moved += 1
                at = t
            owner = self.allocations.owner(name, idx, at)
            if owner is None and at != t:
                at, owner = t, self.allocations.owner(name, idx, t)
            code = self._owner_code(nc, owner)
            if code < 0:
                self.xids_unattributed += 1
                continue
            start = at - at % self.window_ms
            bucket = self._buckets.get(start)
            if bucket is None:
                bucket = self._buckets[start] = _Bucket()
            gid = int(self._gids(np.asarray([nc]), np.asarray([idx]))[0])
            slot = bucket.slot_for_xid(gid, code, int(seq[s]), self._gpu.size)
            bucket.xids.setdefault(slot, []).append(int(xids.values["xid"][i]))

    # -- closing --------------------------------------------------------------------------------
    def close_ready(self, watermark_ms: int | None = None) -> list[JobWindowBatch]:
        """Emit every window ending at or before ``watermark_ms`` (default: :attr:`watermark_ms`),
        grouped per (job, window) and sorted by (window start, job id)."""
        if watermark_ms is None:
            watermark_ms = self.watermark_ms
            if watermark_ms is None:
                return []
        return self.group(self.pop_ready(watermark_ms))

    def pop_ready(self, watermark_ms: int) -> list[ClosedWindows]:
        """:meth:`close_ready` without making the GpuWindow dicts: every closed window start as
        columns, for :meth:`group` (here, or in another process after
        :meth:`ClosedWindows.portable`)."""
        boundary = watermark_ms - watermark_ms % self.window_ms
        if self.closed_until_ms is None or boundary > self.closed_until_ms:
            self.closed_until_ms = boundary
        return self._pop(watermark_ms)

    def flush(self) -> list[JobWindowBatch]:
        """Emit every open window (end of input); later samples of those windows are late."""
        return self.group(self.pop_all())

    def pop_all(self) -> list[ClosedWindows]:
        """:meth:`flush` without making the dicts (see :meth:`pop_ready`)."""
        if self.max_ts_ms is not None:
            end = self.max_ts_ms - self.max_ts_ms % self.window_ms + self.window_ms
            self.closed_until_ms = max(self.closed_until_ms or end, end)
        return self._pop(None)

    def _pop(self, watermark_ms: int | None) -> list[ClosedWindows]:
        out: list[ClosedWindows] = []
        for start in sorted(self._buckets):
            if watermark_ms is None or start + self.window_ms <= watermark_ms:
                out.append(self._closed(start, self._buckets.pop(start)))
        return out

    def _closed(self, start: int, bucket: _Bucket) -> ClosedWindows:
        """One closed bucket as columns: its accumulators, each slot's node and GPU index, and
        the job of each job code (with the metadata a GpuWindow carries)."""
        self._sync_names()
        n = bucket.accs.size
        accs = {k: arr[:n] for k, arr in bucket.accs.arrays.items()}
        gids = accs["gid"]
        g = self._gpu.arrays
        jobs: dict[int, tuple[str, str | None, str | None, str | None]] = {}
        for code in np.unique(accs["job"]).tolist():
            job_id = self._job_names[code]
            meta = self.allocations.job(job_id)
            jobs[code] = (job_id, *((meta.user, meta.partition, meta.account) if meta else
                                    (None, None, None)))  # fmt: skip
        return ClosedWindows(start, start + self.window_ms, accs, g["node"][gids],
                             g["index"][gids], self._names, jobs, bucket.xids)  # fmt: skip

    def group(self, closed: Iterable[ClosedWindows]) -> list[JobWindowBatch]:
        """Closed windows as GpuWindow dicts grouped per (job, window), sorted by (window start,
        job id), each group by (node, GPU)."""
        grouped: dict[tuple[int, str], list[dict[str, Any]]] = {}
        for part in closed:
            start = part.start_ms
            for job, window in part.windows():
                grouped.setdefault((start, job), []).append(window)
        wms = self.window_ms
        return [
            JobWindowBatch(
                job, start, start + wms, sorted(ws, key=lambda w: (w["node"], w["gpu_index"]))
            )
            for (start, job), ws in sorted(grouped.items())
        ]

    def counters(self) -> dict[str, int]:
        """Readings seen, unattributed (no owner), late and invalid samples, counter values out
        of range, XIDs moved or unattributed."""
        return {
            "readings": self.readings,
            "unattributed": self.unattributed,
            "late_samples": self.late_samples,
            "invalid_samples": self.invalid_samples,
            "bad_values": self.bad_values,
            "xids_moved": self.xids_moved,
            "xids_unattributed": self.xids_unattributed,
        }
