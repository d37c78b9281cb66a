"""The replay's native sample path: stage 2 in C over raw Avro, the rest as in :mod:`pipeline`.

A replay spends most of its time turning each NodeGpuSample into dicts and walking them in
:meth:`WindowAggregator.add_batch <peerwatch.streams.core.windows.WindowAggregator.add_batch>`.
Here the C module ``_replay_native`` reads the samples' bytes straight into the aggregator's
accumulators instead:

* :class:`SampleIndex` (C) holds one hour's decompressed blocks and, per sample, its event time,
  node and position, in replay order (time, node name, read order: the order of
  :func:`~peerwatch.streams.offline.replay.sort_records`);
* :class:`NativeWindowAggregator` keeps the open windows, counter memory and cached owners in C
  and does, per GPU reading, the operations of ``add_batch`` in the same order, so its windows
  are the same to the last bit (tested against the Python aggregator on random input). Job
  ownership, XIDs, late samples, closing and the GpuWindow dicts stay in Python, shared with
  :class:`WindowAggregator`;
* :class:`NativePipeline` is :class:`~peerwatch.streams.core.pipeline.Pipeline` fed with runs of
  indexed samples: it drains (closes windows, runs stages 3 and 4) at exactly the samples where
  the Python pipeline would.

Input the C path cannot take exactly (a value beyond int64 or beyond a double's exact integers,
another schema version) raises :class:`NativeUnsupported`; the caller replays through the
Python path instead.
"""

from __future__ import annotations

from array import array
from collections import namedtuple
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from peerwatch.schemas import native as native_codec
from peerwatch.schemas.compiled import Unsupported
from peerwatch.schemas.registry import raw_schema, strip_logical_types
from peerwatch.streams.core.allocation import AllocationTable
from peerwatch.streams.core.model import IDLE_JOB_PREFIX
from peerwatch.streams.core.pipeline import Output, Pipeline, PipelineSettings
from peerwatch.streams.core.windows import _ACC_FIELDS, WindowAggregator

#: The C module, or None (not built, or ``PEERWATCH_NATIVE=0``).
kernel: Any = native_codec.load_native("peerwatch.streams._replay_native")

_FAR_PAST = -(1 << 62)
_FAR_FUTURE = 1 << 62
P_SKIP, P_LONG, P_FLOAT, P_DOUBLE, P_BOOL, P_STRING, P_ENUM = range(7)
_TOP_ROLES = {"node": 1, "ts_ms": 2, "gpus": 3, "xids": 4}
#: GpuReading field -> (role number in the C module, the value kinds it may have).
_INT, _NUM = (P_LONG,), (P_LONG, P_FLOAT, P_DOUBLE)
_GPU_ROLES: dict[str, tuple[int, tuple[int, ...]]] = {
    "index": (1, _INT), "uuid": (2, (P_STRING,)), "state": (3, (P_ENUM,)),
    "sm_clock_mhz": (4, _INT), "sm_clock_max_mhz": (5, _INT), "clocks_event_reasons": (6, _INT),
    "throttle_sw_power_cap_ns": (7, _INT), "throttle_hw_slowdown_ns": (8, _INT),
    "throttle_sw_thermal_ns": (9, _INT), "throttle_hw_thermal_ns": (10, _INT),
    "throttle_hw_power_brake_ns": (11, _INT), "power_mw": (12, _INT),
    "power_limit_mw": (13, _INT), "energy_mj": (14, _INT), "temperature_c": (15, _INT),
    "gpu_util_pct": (16, _INT), "sm_active_pct": (17, _NUM),
    "ecc_volatile_uncorrected": (18, _INT), "remap_pending": (19, (P_BOOL,)),
    "remap_failed": (20, (P_BOOL,)), "pcie_replay_count": (21, _INT),
    "pcie_link_width": (22, _INT), "pcie_link_width_max": (23, _INT),
    "nvlink_replay_errors": (24, _INT), "nvlink_recovery_errors": (25, _INT),
    "nvlink_crc_errors": (26, _INT),
}  # fmt: skip
_PLAN_KIND = {
    native_codec.LONG: P_LONG, native_codec.FLOAT: P_FLOAT, native_codec.DOUBLE: P_DOUBLE,
    native_codec.BOOL: P_BOOL, native_codec.STRING: P_STRING, native_codec.BYTES: P_STRING,
    native_codec.ENUM: P_ENUM,
}  # fmt: skip


#: The values of one accumulator as the C module hands them out; read like an ``_Acc``.
AccValues = namedtuple("AccValues", _ACC_FIELDS)  # type: ignore[misc]


class NativeUnsupported(Exception):
    """The native path cannot take this input exactly; replay through the Python path."""


class ArchiveUnordered(Exception):
    """Samples of an archive out of order by more than the streaming read allows; replay
    again sorting whole hours."""


def available() -> bool:
    """Whether the native sample path can run in this process."""
    return kernel is not None and native_codec.available()


def _field(role: int, plan: Any) -> tuple[int, int, int, int, Any]:
    """``(role, kind, null branch, enum symbols, plan)`` of one field for the C program."""
    kind, a, _ = plan
    null_branch = -1
    if kind == native_codec.UNION and len(a) == 2 and native_codec.NULL in (a[0][0], a[1][0]):
        null_branch = 0 if a[0][0] == native_codec.NULL else 1
        kind, a, _ = plan = a[1 - null_branch]
    p_kind = _PLAN_KIND.get(kind, P_SKIP)
    nsym = len(a) if kind == native_codec.ENUM else 0
    return role, p_kind, null_branch if p_kind != P_SKIP else -1, nsym, plan


def sample_programs(wire_schema: Any) -> tuple[Any, Any, Any, int]:
    """The C field programs of a NodeGpuSample wire schema: ``(top, gpu, xid, lost index)``.
    Raises :class:`NativeUnsupported` where a field the aggregator reads has another type."""
    try:
        plan = native_codec.plan_of(wire_schema)
    except Unsupported as exc:
        raise NativeUnsupported(str(exc)) from exc
    if plan[0] != native_codec.RECORD:
        raise NativeUnsupported("NodeGpuSample is not a record")
    top: list[Any] = []
    gpu: tuple[Any, ...] = ()
    xid: tuple[Any, ...] = ()
    lost = -1
    for name, sub in zip(plan[1], plan[2], strict=True):
        role = _TOP_ROLES.get(name, 0)
        if role in (3, 4):  # arrays of records
            if sub[0] != native_codec.ARRAY or sub[1][0] != native_codec.RECORD:
                raise NativeUnsupported(f"{name} is not an array of records")
            item = sub[1]
            if role == 3:
                gpu, lost = _gpu_program(item)
            else:
                xid = tuple(_field(0, p) for p in item[2])
            top.append((role, P_SKIP, -1, 0, sub))
            continue
        field = _field(role, sub)
        if role in (1, 2) and field[1] != (P_STRING if role == 1 else P_LONG):
            raise NativeUnsupported(f"{name} has an unexpected type")
        top.append(field)
    if not gpu:
        raise NativeUnsupported("no gpus field")
    return tuple(top), gpu, xid, lost


def _gpu_program(item: Any) -> tuple[Any, int]:
    fields, lost = [], -1
    for name, sub in zip(item[1], item[2], strict=True):
        role, kinds = _GPU_ROLES.get(name, (0, ()))
        field = _field(role, sub)
        if role and field[1] not in kinds:
            raise NativeUnsupported(f"gpus.{name} has an unexpected type")
        if name == "index" and field[2] != -1:
            raise NativeUnsupported("gpus.index is optional")
        if name == "state":
            lost = list(field[4][1]).index("LOST") if "LOST" in field[4][1] else -1
        fields.append(field)
    return tuple(fields), lost


def new_index(wire_schema: Any) -> Any:
    """An empty C SampleIndex for samples written with ``wire_schema``."""
    if kernel is None:
        raise NativeUnsupported("the C module is not in use")
    return kernel.SampleIndex(*sample_programs(wire_schema))


def node_ranks(node_ids: Mapping[str, int]) -> array[int]:
    """The rank of each node id's name in name order (the tie-break of the replay order)."""
    ranks = array("i", bytes(4 * len(node_ids)))
    for rank, name in enumerate(sorted(node_ids)):
        ranks[node_ids[name]] = rank
    return ranks


def sort_index(index: Any, node_ids: Mapping[str, int]) -> None:
    """Release every sample of ``index``, in replay order: time, node name, read order."""
    index.release(_FAR_FUTURE, node_ranks(node_ids))


@dataclass(frozen=True)
class SampleRun:
    """Positions ``[lo, hi)`` of a sorted SampleIndex: consecutive samples in replay order."""

    index: Any
    lo: int
    hi: int

    def last_ts_ms(self) -> int:
        return int(self.index.location(self.hi - 1)[3])


class NativeWindowAggregator(WindowAggregator):
    """:class:`WindowAggregator` whose per-reading state and work are in C (module docstring).
    ``node_ids`` maps node names to the ids the SampleIndexes give them (shared, growing)."""

    def __init__(
        self,
        allocations: AllocationTable,
        node_ids: dict[str, int],
        window_s: int,
        lateness_s: float,
        idle_jobs: bool = False,
        acc_type: type = AccValues,
    ) -> None:
        """``acc_type``: what closed accumulators are (a tuple subclass with the fields of
        ``_Acc``, or plain tuples in that order to send them elsewhere)."""
        super().__init__(allocations, window_s, lateness_s, idle_jobs)
        if kernel is None:
            raise NativeUnsupported("the C module is not in use")
        self.node_ids = node_ids
        self._names: list[str] = []
        self._jobs: list[str] = []
        self._job_ids: dict[str, int] = {}
        self.kernel = kernel.Windows(self.window_ms, idle_jobs, self._segment, self._jobs, acc_type)

    def _name(self, node_id: int) -> str:
        if node_id >= len(self._names):
            self._names = list(self.node_ids)  # ids are given in insertion order
        return self._names[node_id]

    def _job_id(self, job: str) -> int:
        got = self._job_ids.get(job)
        if got is None:
            got = self._job_ids[job] = len(self._jobs)
            self._jobs.append(job)
        return got

    def _segment(self, node_id: int, ts_ms: int) -> tuple[Any, int, int | None, int]:
        node = self._name(node_id)
        owners, lo, hi = self.allocations.segment(node, ts_ms)
        pairs = tuple((int(gpu), self._job_id(job)) for gpu, job in owners.items())
        idle = self._job_id(IDLE_JOB_PREFIX + node) if self.idle_jobs else -1
        return pairs, lo, hi, idle

    def add_batch(self, samples: Any) -> list[Mapping[str, Any]]:
        raise TypeError("NativeWindowAggregator takes indexed samples (feed), not dicts")

    def feed(self, run: SampleRun, next_close_ms: int, max_batch: int, count: int) -> Any:
        """The C feed over ``run`` (see ``_replay_native.Windows.feed``): ``(pos, count,
        flags)``. Raises NativeUnsupported for values the C path cannot take exactly."""
        closed = self.closed_until_ms if self.closed_until_ms is not None else _FAR_PAST
        try:
            got = self.kernel.feed(
                run.index, run.lo, run.hi, closed, next_close_ms, max_batch, count
            )
        except (OverflowError, ValueError) as exc:
            raise NativeUnsupported(f"sample beyond the native path: {exc}") from exc
        self.max_ts_ms = self.kernel.max_ts
        self.readings = self.kernel.readings
        self.unattributed = self.kernel.unattributed
        return got

    def invalidate(self) -> None:
        self.kernel.invalidate()

    def _put_xid(self, node: str, start: int, owner: str, idx: int, xid: int) -> None:
        self.kernel.add_xid(self.node_ids[node], start, self._job_id(owner), idx, xid)

    def _pop(self, watermark_ms: int | None) -> Iterator[tuple[str, int, Any]]:
        for node_id, start, acc in self.kernel.pop(watermark_ms):
            yield self._name(node_id), start, acc

    def to_dict(self) -> dict[str, Any]:
        raise TypeError("the native aggregator is replay-only and has no checkpoint")


class NativePipeline(Pipeline):
    """:class:`Pipeline` taking samples as :class:`SampleRun` s (:meth:`feed_samples`); every
    other stream through :meth:`Pipeline.feed`."""

    def __init__(
        self, settings: PipelineSettings, node_ids: dict[str, int], acc_type: type = AccValues
    ) -> None:
        super().__init__(settings)
        self.aggregator: NativeWindowAggregator = NativeWindowAggregator(
            self.allocations,
            node_ids,
            settings.detector.window_s,
            settings.lateness_s,
            idle_jobs=True,
            acc_type=acc_type,
        )
        self._decode = native_codec.native_decoder(strip_logical_types(raw_schema("NodeGpuSample")))
        self._count = 0
        self._late: list[Mapping[str, Any]] = []

    def feed(self, stream: str, key: str, value: Mapping[str, Any]) -> list[Output]:
        if stream == "samples":
            raise TypeError("NativePipeline takes samples as SampleRuns (feed_samples)")
        return super().feed(stream, key, value)

    def feed_samples(self, run: SampleRun) -> list[Output]:
        """The samples of ``run``, in order; returns what they caused."""
        agg, out, pos = self.aggregator, [], run.lo
        closed = agg.closed_until_ms if agg.closed_until_ms is not None else _FAR_PAST
        while pos < run.hi:
            part = SampleRun(run.index, pos, run.hi)
            pos, self._count, flags = agg.feed(
                part, self._next_close_ms, self.settings.max_batch, self._count
            )
            if flags & (kernel.F_XIDS | kernel.F_LATE):
                block, offset, _, ts = run.index.location(pos - 1)
                sample = self._decode(block, offset)[0]
                if flags & kernel.F_LATE:
                    self._late.append(sample)
                else:
                    agg._add_xids(sample["node"], ts, sample["xids"], closed)
            if flags & kernel.F_DRAIN:
                out += self._drain()
                closed = agg.closed_until_ms if agg.closed_until_ms is not None else _FAR_PAST
        return out

    def _drain(self) -> list[Output]:
        if not self._count:
            return []
        self._count = 0
        late, self._late = self._late, []
        self.aggregator.late_samples += len(late)
        return self._after_batch(late)

    def _allocations_changed(self) -> None:
        self.aggregator.invalidate()
