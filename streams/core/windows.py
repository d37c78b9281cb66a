"""Stage 2, the hot path: attribute GPU readings to jobs and pre-aggregate event-time windows.

One implementation for the live hot stage, replay and the evaluation. :class:`WindowAggregator`
takes BATCHES of NodeGpuSample records as columns (:mod:`peerwatch.schemas.columns`: the C
decoder fills them straight from Avro bytes, :meth:`WindowAggregator.add_batch` from decoded
dicts) and does its work per batch: numpy lays the batch out (each reading's GPU, owner,
window and slot), and two loops compiled by numba (:mod:`~peerwatch.streams.core.loops`) do the
per-reading arithmetic, so no Python statement runs per GPU reading. Each GPU reading is attributed to the job that owned
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

Results do not depend on how the input is cut into batches: sums of floats are taken one
reading at a time in the order the readings arrived, onto each window's running sum, so a
window is the same to the last bit whether its readings came in one batch or many.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from peerwatch.schemas.columns import Table, table_spec, tables_from_records
from peerwatch.schemas.registry import raw_schema, strip_logical_types
from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.gpu_rows import GpuKeys, GrowingRows, cached_gpu_keys, gpu_code_parts
from peerwatch.streams.core.hard_rules import (
    MAY_FIRE_BELOW,
    MAY_FIRE_FIELDS,
    NVLINK_FIELDS,
    XID_FIELD,
)
from peerwatch.streams.core.loops import (
    COLUMNS,
    COUNTER_FIELDS,
    COUNTS,
    DELTAS,
    MEMORY,
    POWER_BRAKE_BIT,
    POWER_CAP_BIT,
    SUMS,
    THERMAL_BITS,
    THROTTLE_BITS,
    VALUE_LIMIT,
    accumulate,
    counter_deltas,
    warm,
)
from peerwatch.streams.core.model import IDLE_JOB_PREFIX
from peerwatch.streams.core.settings import DetectorSettings, StreamSettings
from peerwatch.streams.core.window_columns import (
    FloatColumn,
    WindowColumns,
    from_arrays,
    may_fire_columns,
    reporting,
)
from peerwatch.streams.core.window_dicts import (
    NONE_MAX,
    NONE_MIN,
    LazyWindows,
    WindowDicts,
    ratios,
    share_arrays,
)

__all__ = [
    "NVLINK_FIELDS",
    "POWER_BRAKE_BIT",
    "POWER_CAP_BIT",
    "THERMAL_BITS",
    "THROTTLE_BITS",
    "VALUE_LIMIT",
]

#: The settings tree's defaults (``detector.window_s``, ``stream.lateness_s``).
DEFAULT_WINDOW_S = DetectorSettings().window_s
DEFAULT_LATENESS_S = StreamSettings().lateness_s
_FAR_PAST = -(1 << 62)
_NONE_MAX, _NONE_MIN = NONE_MAX, NONE_MIN  # "no value yet" of running maxima, minima

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

#: Per-slot accumulators: the loops' int accumulators (sums, counts, running max/min/flags)
#: and float sums.
_INT_ACCS = (*COUNTS, *DELTAS)
_MAX_ACCS = ("temp", "wmax", "remap_p", "remap_f", "lost")
_MIN_ACCS = ("wmin",)
_INT_FILL = np.array([_NONE_MAX if k in _MAX_ACCS else _NONE_MIN if k in _MIN_ACCS else 0
                      for k in _INT_ACCS], np.int64)  # fmt: skip


@dataclass
class JobWindowBatch:
    """The GpuWindow dicts of one job for one window, from one aggregator (sorted by GPU)."""

    job_id: str
    window_start_ms: int
    window_end_ms: int
    windows: Sequence[dict[str, Any]]
    #: what the detector reads of every window, made with them by the aggregator (None: the
    #: detector reads the dicts; windows decoded from Kafka, merged from several parts)
    columns: WindowColumns | None = None


@dataclass
class ColumnsBatch:
    """One job's windows of one window start as the aggregator's columns (``closed`` holds this
    job's windows only): what stage 3 receives from the hot stage. The GpuWindow dicts and the
    detector's columns are made when the window is released (:meth:`batch`), once, after the
    batches of every source are merged (:func:`merge_closed`)."""

    job_id: str
    window_start_ms: int
    window_end_ms: int
    closed: ClosedWindows

    def __len__(self) -> int:
        return len(self.closed.node)

    def gpu_keys(self) -> list[str]:
        """The GPU key (``node/index``) of each window, in slot order."""
        c = self.closed
        return cached_gpu_keys(None, c.names, c.node, c.gpu_index)

    def batch(self) -> JobWindowBatch:
        """The job's windows (sorted by GPU) and their detector columns. Raises ValueError when
        the columns hold another job's windows."""
        got = self.closed.by_job()
        if [job for job, _, _ in got] != [self.job_id]:
            raise ValueError(f"window columns of job {self.job_id!r} hold other jobs' windows")
        [(_, windows, columns)] = got
        return JobWindowBatch(self.job_id, self.window_start_ms, self.window_end_ms, windows,
                              columns)  # fmt: skip


@dataclass
class BatchResult:
    """What :meth:`WindowAggregator.add_columns` did not accumulate: row numbers of late and of
    invalid samples (the driver dead-letters them)."""

    late: np.ndarray
    invalid: np.ndarray


class ClosedWindows(NamedTuple):
    """The slots of one closed window start, all jobs, as columns (:meth:`by_job` makes the
    GpuWindow dicts, or the channel encodes them straight from these columns)."""

    start_ms: int
    end_ms: int
    #: the bucket's accumulators, one row per slot (see ``_Bucket``)
    accs: Mapping[str, np.ndarray]
    node: np.ndarray  # node code of each slot
    gpu_index: np.ndarray  # GPU index of each slot
    #: the string of a node or UUID code: the aggregator's list (or a copy of it)
    names: Sequence[str]
    #: job code -> (job id, user, partition, account)
    jobs: Mapping[int, tuple[str, str | None, str | None, str | None]]
    xids: Mapping[int, list[int]]  # slot -> XIDs seen in it
    #: GPU keys (``node/index``) already made from ``names``, by :func:`gpu_code_key` (the
    #: owner's, kept across closes; None: made afresh)
    key_cache: dict[int, str] | None = None

    def subset(self, slots: np.ndarray) -> ClosedWindows:
        """The windows of ``slots`` only, in that order (the XIDs follow their windows)."""
        take = np.asarray(slots, np.int64)
        xids: dict[int, list[int]] = {}
        if self.xids:
            row = np.full(len(self.node), -1, np.int64)
            row[take] = np.arange(len(take))
            xids = {int(row[s]): x for s, x in self.xids.items() if row[s] >= 0}
        accs = {k: v[take] for k, v in self.accs.items()}
        return self._replace(accs=accs, node=self.node[take], gpu_index=self.gpu_index[take],
                             xids=xids, key_cache=None)  # fmt: skip

    def ratio(self, total: str, count: str) -> tuple[np.ndarray, np.ndarray]:
        """The mean of one accumulator per slot (``total / count``; 0.0 where ``count`` is 0),
        and where it is known: the values of a GpuWindow's mean field (e.g. ``clk_ratio``)."""
        return ratios(self.accs[total], self.accs[count])

    def shares(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """One throttle reason's share of each slot's time (0.0 where unknown), and where it is
        known: the values of a GpuWindow's ``*_frac`` field (``thr``, ``cap``, ``thm``,
        ``brk``)."""
        return share_arrays(self.accs, name)

    def by_job(self) -> list[tuple[str, LazyWindows, WindowColumns]]:
        """``(job id, its GpuWindow dicts, their columns)`` of every job with a slot, each
        job's windows sorted by (node, GPU index), slot order among equals (fields the hot path
        cannot know: null). The dicts are made when first read (:class:`LazyWindows`); the
        columns (:class:`WindowColumns`: what the detector reads of every window) come from the
        same arrays as the dicts' values.

        Every derived value is computed per column (the same float operations, in the same
        order, as one window at a time would do). The order comes from one sort of the columns,
        not a key made per window."""
        a = self.accs
        n = len(a["gid"])
        if not n:
            return []
        names = self.names
        # by job code, then node name, then GPU index; np.lexsort is stable (slot order stays
        # among equals, as sorting each job's windows would keep it)
        codes, node_of = np.unique(self.node, return_inverse=True)
        by_name = sorted(range(len(codes)), key=[names[c] for c in codes.tolist()].__getitem__)
        rank = np.empty(len(codes), np.int64)
        rank[by_name] = np.arange(len(codes))
        order = np.lexsort((self.gpu_index, rank[node_of], a["job"]))
        slots = order.tolist()
        jobs = a["job"][order]
        cuts = (np.flatnonzero(jobs[1:] != jobs[:-1]) + 1).tolist()
        dicts = WindowDicts(self)
        cols = self._columns(order, dicts)
        metas = self.jobs
        return [
            (metas[int(jobs[lo])][0], LazyWindows(dicts, slots[lo:hi]), cols(lo, hi))
            for lo, hi in zip([0, *cuts], [*cuts, n], strict=True)
        ]

    def _columns(
        self, order: np.ndarray, dicts: WindowDicts
    ) -> Callable[[int, int], WindowColumns]:
        """The detector's columns of the windows in ``order`` (slots), from the arrays the
        dicts' values come from, as a function of a range of that order."""

        def truthy(name: str) -> np.ndarray:  # a sparse int or bool field's truth
            out: np.ndarray = dicts.field(name)[0] != 0
            return out

        def widths(name: str) -> np.ndarray:  # NaN where the window holds None
            values, absent = dicts.field(name)
            out: np.ndarray = np.where(values == absent, np.nan, values)
            return out

        has_xids = np.zeros(len(order), np.bool_)
        has_xids[list(self.xids)] = True
        flags = [has_xids if f == XID_FIELD else truthy(f) for f in MAY_FIRE_FIELDS]
        below = [(widths(low), widths(high)) for low, high in MAY_FIRE_BELOW]
        fires = may_fire_columns(flags, below, len(has_xids))[order]
        reports = reporting(truthy("lost"), dicts.field("samples")[0])[order]
        floats = {
            f: from_arrays(*dicts.field(f)).take(order)
            for f in ("clk_ratio", "throttle_frac", "sm_frac", "power_ratio")
        }
        keys = cached_gpu_keys(self.key_cache, self.names, self.node[order], self.gpu_index[order])

        def cols(lo: int, hi: int) -> WindowColumns:
            sliced = {
                k: FloatColumn(c.values[lo:hi], None if c.nan_given is None else c.nan_given[lo:hi])
                for k, c in floats.items()
            }
            sliced["step_ms"] = FloatColumn(np.full(hi - lo, np.nan), None)
            return WindowColumns(keys[lo:hi], reports[lo:hi], fires[lo:hi], sliced)

        return cols


def merge_closed(parts: Sequence[ClosedWindows]) -> ClosedWindows:
    """Closed windows of one window start from several parts (sources) as one: each part's
    node, UUID and job codes renumbered into one table (a name or job once), its rows after the
    parts before it."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    name_code: dict[str, int] = {}  # one code per name: a node in two parts sorts as one
    jobs: dict[int, tuple[str, str | None, str | None, str | None]] = {}
    code_of: dict[str, int] = {}  # job id -> code (its first part's metadata stands)
    nodes, uuids, job_codes, xids = [], [], [], {}
    rows = 0
    for p in parts:
        if p.start_ms != first.start_ms or p.end_ms != first.end_ms:
            raise ValueError(f"windows of {p.start_ms} merged with windows of {first.start_ms}")
        names = np.array([name_code.setdefault(n, len(name_code)) for n in p.names], np.int64)
        nodes.append(names[p.node])
        uuid = p.accs["uuid"]
        uuids.append(np.where(uuid >= 0, names[np.maximum(uuid, 0)], -1))
        recode = np.zeros(max(p.jobs, default=-1) + 1, np.int64)
        for code, meta in p.jobs.items():
            recode[code] = code_of.setdefault(meta[0], len(code_of))
            jobs.setdefault(recode[code].item(), meta)
        job_codes.append(recode[p.accs["job"]])
        xids.update({rows + r: x for r, x in p.xids.items()})
        rows += len(p.node)
    accs = {k: np.concatenate([p.accs[k] for p in parts]) for k in first.accs}
    accs["uuid"], accs["job"] = np.concatenate(uuids), np.concatenate(job_codes)
    accs["gid"] = np.arange(rows)  # an aggregator's GPU codes mean nothing across parts
    gpu_index = np.concatenate([p.gpu_index for p in parts])
    return ClosedWindows(first.start_ms, first.end_ms, accs, np.concatenate(nodes), gpu_index,
                         list(name_code), jobs, xids)  # fmt: skip


class _Bucket:
    """The accumulators of one window start, all nodes: one slot per (GPU, job)."""

    def __init__(self, rows: int = 0) -> None:
        """``rows``: the slots to make room for at once (the last window's: a fleet keeps its
        size from one window to the next, and growing by doubling copies every slot twice)."""
        self.accs = GrowingRows({"gid": -1, "job": -1, "uuid": -1, "seq": 0}, (),
                                {"ints": _INT_FILL, "sums": np.zeros(len(SUMS))})  # fmt: skip
        self.accs.reserve(rows)
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
        warm()
        self.allocations = allocations
        self.idle_jobs = idle_jobs
        self.window_ms = int(window_s * 1000)
        self.lateness_ms = int(lateness_s * 1000)
        self.max_ts_ms: int | None = None
        #: Every window ending at or before this has been emitted; older samples are late.
        self.closed_until_ms: int | None = None
        #: Codes of the strings in the columns (node names, UUIDs): give it to the decoder.
        self.strings: dict[str, int] = {}
        #: GPU keys made for closed windows, by GPU code (see ClosedWindows.key_cache)
        self._key_cache: dict[int, str] = {}
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
        self._gpu = GrowingRows({"node": 0, "index": 0, "owner": -1, "ts": -1}, (),
                                {"mem": np.zeros(len(MEMORY), np.int64),
                                 "mem_ok": np.zeros(len(MEMORY), np.bool_)})  # fmt: skip
        self._buckets: dict[int, _Bucket] = {}
        self._bucket_rows = 0  # the slots of the last window closed
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
        return self._gid_of.lookup(node, index, self._new_gids)

    def _new_gids(self, new_keys: np.ndarray) -> np.ndarray:
        """Ids for GPUs not seen before (their keys, sorted): node, index and owner set."""
        first = self._gpu.add(len(new_keys))
        g = self._gpu.arrays
        ids = np.arange(first, first + len(new_keys))
        g["node"][ids], g["index"][ids] = gpu_code_parts(new_keys)
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
        kept = keep[gpus.parent]
        # every reading kept (the usual batch): the columns themselves, not copies of them
        whole = bool(kept.all())
        rows = np.arange(gpus.n) if whole else np.flatnonzero(kept)
        parent = gpus.parent if whole else gpus.parent[rows]
        index = gpus.values["index"] if whole else gpus.values["index"][rows]
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

        self._aggregate(gpus, rows, whole, parent, gid, job, ts, seq)
        if xids.n:
            self._add_xids(xids, keep, node, ts, seq, closed)
        return result

    def _aggregate(self, gpus: Table, rows: np.ndarray, whole: bool, parent: np.ndarray,
                   gid: np.ndarray, job: np.ndarray, ts: np.ndarray, seq: np.ndarray) -> None:  # fmt: skip
        """Counter deltas and window sums of the kept readings ``rows`` of ``gpus`` (``whole``:
        all of them)."""
        v, ok = gpus.values, gpus.valid
        lost = (v["state"] if whole else v["state"][rows]) == _LOST
        t = ts[parent]
        g = self._gpu.arrays
        deltas, bad = counter_deltas(
            gid, t, lost, rows, [v[c] for c in COUNTER_FIELDS], [ok[c] for c in COUNTER_FIELDS],
            g["ts"], g["mem"], g["mem_ok"])  # fmt: skip
        self.bad_values += bad

        attributed = job >= 0
        wstart = t - t % self.window_ms
        n_gids = self._gpu.size
        uuid = v["uuid"] if whole else v["uuid"][rows]
        values = [v[c] for c in COLUMNS if c != "sm_active_pct"]
        valid = [ok[c] for c in COLUMNS if c != "sm_active_pct"]
        sm_active, sm_active_ok = v["sm_active_pct"], ok["sm_active_pct"]
        starts = wstart[attributed]
        if not len(starts):
            return
        first, last = int(starts.min()), int(starts.max())  # usually one start, or two
        for start in [first] if first == last else np.unique(starts).tolist():
            sel = np.flatnonzero(attributed & (wstart == start))
            bucket = self._buckets.get(start)
            if bucket is None:
                bucket = self._buckets[start] = self._new_bucket()
            slot = bucket.slots(gid[sel], job[sel], seq[parent[sel]], uuid[sel], n_gids)
            a = bucket.accs.arrays
            accumulate(sel, slot, rows, lost, values, valid, sm_active, sm_active_ok, deltas,
                       a["ints"], a["sums"])  # fmt: skip

    def _new_bucket(self) -> _Bucket:
        """The accumulators of a new window start, with room for as many slots as the largest
        window open or the last one closed (a fleet keeps its size from window to window)."""
        open_rows = (b.accs.size for b in self._buckets.values())
        return _Bucket(max([self._bucket_rows, *open_rows]))

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
                bucket = self._buckets[start] = self._new_bucket()
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
        columns, for :meth:`group`."""
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
        n = self._bucket_rows = bucket.accs.size
        a = bucket.accs.arrays
        accs = {k: a[k][:n] for k in ("gid", "job", "uuid", "seq")}
        for wide, names in (("ints", _INT_ACCS), ("sums", SUMS)):
            columns = a[wide][:n].T.copy()  # one row per accumulator: each is contiguous
            accs.update(zip(names, columns, strict=True))
        gids = accs["gid"]
        g = self._gpu.arrays
        jobs: dict[int, tuple[str, str | None, str | None, str | None]] = {}
        for code in np.unique(accs["job"]).tolist():
            job_id = self._job_names[code]
            meta = self.allocations.job(job_id)
            jobs[code] = (job_id, *((meta.user, meta.partition, meta.account) if meta else
                                    (None, None, None)))  # fmt: skip
        return ClosedWindows(start, start + self.window_ms, accs, g["node"][gids],
                             g["index"][gids], self._names, jobs, bucket.xids,
                             self._key_cache)  # fmt: skip

    def group(self, closed: Iterable[ClosedWindows]) -> list[JobWindowBatch]:
        """Closed windows as GpuWindow dicts grouped per (job, window), sorted by (window start,
        job id), each group by (node, GPU)."""
        grouped: dict[tuple[int, str], Sequence[dict[str, Any]]] = {}
        columns: dict[tuple[int, str], WindowColumns] = {}
        merged: set[tuple[int, str]] = set()  # windows of more than one part: sorted again
        for part in closed:
            start = part.start_ms
            for job, windows, cols in part.by_job():
                have = grouped.setdefault((start, job), windows)
                if have is not windows:
                    grouped[(start, job)] = [*have, *windows]
                    merged.add((start, job))
                else:
                    columns[(start, job)] = cols
        wms = self.window_ms
        for key in merged:
            grouped[key] = sorted(grouped[key], key=lambda w: (w["node"], w["gpu_index"]))
            del columns[key]  # the detector reads the merged windows themselves
        return [
            JobWindowBatch(job, start, start + wms, ws, columns.get((start, job)))
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
