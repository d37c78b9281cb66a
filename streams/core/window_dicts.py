"""The GpuWindow dicts of closed windows, made when they are needed.

:class:`~peerwatch.streams.core.windows.ClosedWindows` holds a window start's accumulators as
columns. :class:`WindowDicts` turns them into GpuWindow dicts: every field's values as arrays
(:meth:`WindowDicts.values`, each derived value computed per column), then either every dict at
once (:meth:`WindowDicts.every`: what a live worker publishes, or replay with ``--windows``) or
one window's (:meth:`WindowDicts.one`: the few windows a finding is made of; both read the same
arrays, so a window is the same dict either way). :class:`LazyWindows` is one job's windows as a
sequence that makes a dict on first access, and all of them on first iteration: the detector
reads every window's values from its columns
(:class:`~peerwatch.streams.core.window_columns.WindowColumns`) and opens a dict only for a
window it reports on.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import cache, lru_cache
from itertools import repeat
from operator import setitem
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from peerwatch.schemas import column_encoder as ce
from peerwatch.schemas import registry
from peerwatch.schemas.compiled import compile_encoder

if TYPE_CHECKING:
    from peerwatch.streams.core.windows import ClosedWindows

NONE_MAX = np.iinfo(np.int64).min  # "no value yet" of running maxima
NONE_MIN = np.iinfo(np.int64).max  # of running minima
#: GpuWindow dicts filled field by field this many at a time (about half a MiB of dicts).
_DICT_CHUNK = 512
#: The fields of a window's job, in its dict's order of them.
_JOB_FIELDS = ("job_id", "user", "partition", "account")


def present_list(values: np.ndarray, present: np.ndarray) -> list[Any]:
    """``values`` as Python numbers, None where not ``present`` (few, usually: set one by one)."""
    out: list[Any] = values.tolist()
    if not present.all():
        for i in np.flatnonzero(~present).tolist():
            out[i] = None
    return out


def ratios(
    total: np.ndarray, count: np.ndarray, scale: float | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``total / count`` (then ``/ scale``) per slot (0.0 where ``count`` is 0), and where
    ``count`` is not 0."""
    some = count != 0
    mean = np.divide(total, count, out=np.zeros(len(total)), where=some)
    if scale is not None:
        mean = mean / scale
    return mean, some


def share_arrays(a: Mapping[str, np.ndarray], name: str) -> tuple[np.ndarray, np.ndarray]:
    """Share of each slot's time under one throttle reason (0.0 where unknown): from its
    counter when the counter moved time on, else from the reason bits sampled each tick; and
    where it is known."""
    timed = a[f"{name}_dt"] != 0
    sampled = a["bits_n"] != 0
    by_time = np.divide(a[f"{name}_ns"], a[f"{name}_dt"], out=np.zeros(len(timed)), where=timed)
    by_bits = np.divide(a[f"{name}_bits"], a["bits_n"], out=np.zeros(len(timed)), where=sampled)
    return np.where(timed, by_time, by_bits), timed | sampled


#: A field's values: (values, where present), (values, the value that means None) for a sparse
#: field, or one value for every window (None: per job, or made per window).
_Field = tuple[str, Any]


@cache
def _gpu_window_types() -> dict[str, Any]:
    """GpuWindow field name -> its Avro type (logical types stripped)."""
    wire: Any = registry.strip_logical_types(registry.raw_schema("GpuWindow"))
    return {f["name"]: f["type"] for f in wire["fields"]}


@cache
def _value_encoder(name: str) -> Callable[[Any], bytes]:
    """One GpuWindow field's value, Avro-encoded alone (its union branch included)."""
    one = compile_encoder({"type": "record", "name": "One",
                           "fields": [{"name": "v", "type": _gpu_window_types()[name]}]})  # fmt: skip
    return lambda value: one({"v": value})


@lru_cache(maxsize=1 << 18)
def _encoded_name(name: str, value: str | None) -> bytes:
    """A string field's value (a node name, a GPU UUID, a job's), Avro-encoded alone: kept,
    as stage 3 encodes the same GPUs' windows every few seconds (about 40 MiB at the bound,
    four GPUs' names each, a 65,000-GPU fleet)."""
    return _value_encoder(name)(value)


def _numbers(name: str, values: np.ndarray, present: np.ndarray | None) -> ce.Piece:
    """A number field's column as Avro (``present`` None: every window holds a value). Raises
    Unfit for a value the field's type cannot hold (a None where it is not nullable)."""
    t = _gpu_window_types()[name]
    nullable = isinstance(t, list)
    base = t[1] if nullable else t
    if present is not None and not present.all():
        if not nullable:
            raise ce.Unfit(f"{name}: None where the field is not nullable")
        values = np.where(present, values, 0)  # no value there: nothing out of range
    if base == "double":
        piece = ce.doubles(values)
    elif base == "boolean":
        piece = ce.booleans(values)
    else:
        piece = ce.varints(values, base)
    return ce.nullable(piece, present) if nullable else piece


def _given(name: str, values: Sequence[Any], n: int) -> ce.Piece:
    """A field's column from a value per window (None: absent): a float field from its numbers,
    any other field from the encodings of its distinct values."""
    if len(values) != n:
        raise ce.Unfit(f"{name}: {len(values)} values for {n} windows")
    t = _gpu_window_types()[name]
    if (t[1] if isinstance(t, list) else t) == "double":
        present = np.fromiter((v is not None for v in values), np.bool_, n)
        numbers = np.array([0.0 if v is None else v for v in values], np.float64)
        return _numbers(name, numbers, present)
    value = _value_encoder(name)
    code_of: dict[Any, int] = {}
    codes = np.fromiter((code_of.setdefault(v, len(code_of)) for v in values), np.int64, n)
    table = [value(v) for v in code_of]
    return ce.by_code(table, codes)


class WindowDicts:
    """The GpuWindow dicts of one :class:`ClosedWindows` (see the module docstring), by slot."""

    def __init__(self, closed: ClosedWindows) -> None:
        self.closed = closed
        self.n = len(closed.accs["gid"])
        self.job_codes: list[int] = closed.accs["job"].tolist()
        self._fields = self.values()
        self._every: list[dict[str, Any]] | None = None

    def values(self) -> list[tuple[str, str, Any]]:
        """Every field in order: ``(name, kind, what)``; kind ``"job"`` (the job's), ``"same"``
        (``what`` for every window), ``"xids"``, ``"names"`` (codes of strings, -1: None),
        ``"present"`` ((values, present)) or ``"sparse"`` ((values, the value meaning None or
        None))."""
        c, a = self.closed, self.closed.accs
        temp = a["temp"]
        return [
            ("job_id", "job", None),
            ("node", "names", c.node),
            ("gpu_index", "present", (c.gpu_index, None)),
            ("gpu_uuid", "names", a["uuid"]),
            ("window_start_ms", "same", c.start_ms),
            ("window_end_ms", "same", c.end_ms),
            ("samples", "sparse", (a["n"], None)),
            ("user", "job", None),
            ("partition", "job", None),
            ("account", "job", None),
            ("clk_ratio", "present", ratios(a["clk_s"], a["clk_n"])),
            ("throttle_frac", "present", share_arrays(a, "thr")),
            ("power_cap_frac", "present", share_arrays(a, "cap")),
            ("sm_frac", "present", ratios(a["sm_s"], a["sm_n"], 100.0)),
            ("power_ratio", "present", ratios(a["pr_s"], a["pr_n"])),
            ("power_w", "present", ratios(a["pw_s"], a["pw_n"], 1000.0)),
            ("temperature_c_max", "present", (temp, temp != NONE_MAX)),
            ("energy_j", "present", (a["energy"] / 1000.0, a["energy_n"] != 0)),
            ("ecc_uncorrected_delta", "sparse", (a["ecc"], None)),
            ("nvlink_errors_delta", "sparse", (a["nvl"], None)),
            ("pcie_replay_delta", "sparse", (a["pcie"], None)),
            ("pcie_link_width_min", "sparse", (a["wmin"], NONE_MIN)),
            ("pcie_link_width_max", "sparse", (a["wmax"], NONE_MAX)),
            ("remap_pending", "sparse", (a["remap_p"] > 0, None)),
            ("remap_failed", "sparse", (a["remap_f"] > 0, None)),
            ("lost", "sparse", (a["lost"] > 0, None)),
            ("xids", "xids", None),
            ("step_ms", "same", None),
            ("score", "same", None),
            ("gated", "same", None),
            ("thermal_frac", "present", share_arrays(a, "thm")),
            ("power_brake_frac", "present", share_arrays(a, "brk")),
            ("fleet_clk_ratio", "same", None),
        ]

    def field(self, name: str) -> Any:
        """What :meth:`values` gives for one field (the arrays the dicts' values come from)."""
        return next(what for n, _, what in self._fields if n == name)

    def one(self, slot: int) -> dict[str, Any]:
        """The GpuWindow dict of one slot (equal to :meth:`every`'s)."""
        names, meta = self.closed.names, self.closed.jobs[self.job_codes[slot]]
        w: dict[str, Any] = {}
        for name, kind, what in self._fields:
            if kind == "job":
                w[name] = meta[_JOB_FIELDS.index(name)]
            elif kind == "same":
                w[name] = what
            elif kind == "names":
                code = int(what[slot])
                w[name] = names[code] if code >= 0 else None
            elif kind == "xids":
                seen = self.closed.xids.get(slot)
                w[name] = sorted(set(seen)) if seen else []
            elif kind == "present":
                values, present = what
                w[name] = values[slot].item() if present is None or present[slot] else None
            else:  # sparse
                values, absent = what
                v = values[slot].item()
                w[name] = None if absent is not None and v == absent else v
        return w

    def encoded(
        self, header: bytes, given: Mapping[str, Sequence[Any]] | None = None
    ) -> list[bytes]:
        """Every slot's GpuWindow message (``header`` + the Avro record), in slot order, made
        from the columns without a dict: the bytes the codec writes for :meth:`every`'s dicts
        (tested). ``given``: fields whose value each slot gets from here instead (field -> a
        value per slot; stage 3's ``score`` and ``gated``). Raises
        :class:`~peerwatch.schemas.column_encoder.Unfit` for a value the schema cannot hold
        (encode the dicts then: that encoder names the field)."""
        c, n = self.closed, self.n
        pieces = [ce.constant(header)]
        for name, kind, what in self._fields:
            value = _value_encoder(name)
            if given is not None and name in given:
                pieces.append(_given(name, given[name], n))
            elif kind == "job":
                codes, local = np.unique(c.accs["job"], return_inverse=True)
                at = _JOB_FIELDS.index(name)
                table = [_encoded_name(name, c.jobs[code][at]) for code in codes.tolist()]
                pieces.append(ce.by_code(table, local))
            elif kind == "same":
                pieces.append(ce.constant(value(what)))
            elif kind == "names":
                codes, local = np.unique(what, return_inverse=True)
                table = [_encoded_name(name, c.names[u] if u >= 0 else None)
                         for u in codes.tolist()]  # fmt: skip
                pieces.append(ce.by_code(table, local))
            elif kind == "xids":
                rows = np.zeros(n, np.int64)  # 0: no XID (most windows)
                table = [value([])]
                for slot, seen in c.xids.items():
                    if seen:
                        rows[slot] = len(table)
                        table.append(value(sorted(set(seen))))
                pieces.append(ce.by_code(table, rows))
            elif kind == "present":
                pieces.append(_numbers(name, *what))
            else:  # sparse
                values, absent = what
                pieces.append(_numbers(name, values, None if absent is None else values != absent))
        return ce.assemble(pieces, n)

    def every(self) -> list[dict[str, Any]]:
        """Every slot's GpuWindow dict, in slot order (made once)."""
        if self._every is None:
            self._every = self._make_every()
        return self._every

    def _make_every(self) -> list[dict[str, Any]]:
        n, metas, names = self.n, self.closed.jobs, self.closed.names
        base: dict[str, Any] = {}
        listed: list[tuple[str, list[Any]]] = []  # a value per window
        exceptions: list[tuple[str, list[int], list[Any]]] = []
        for name, kind, what in self._fields:
            base[name] = None
            if kind == "same":
                base[name] = what
            elif kind == "names":
                codes = what.tolist()
                listed.append((name, [names[u] if u >= 0 else None for u in codes]))
            elif kind == "xids":
                xids: list[Any] = [[] for _ in range(n)]  # a list of its own each
                for i, seen in self.closed.xids.items():
                    xids[i] = sorted(set(seen))
                listed.append((name, xids))
            elif kind == "present":
                values, present = what
                listed.append((name, values.tolist() if present is None else
                               present_list(values, present)))  # fmt: skip
            elif kind == "sparse" and n:
                # most windows share a value: that value in the template, the others set
                # window by window (few: a lost GPU, an ECC error, a window at a job's edge)
                values, absent = what
                first = values[0]
                other = np.flatnonzero(values != first)
                if len(other) * 2 > n:  # the first is not most windows' value: the commonest
                    uniq, counts = np.unique(values, return_counts=True)
                    first = uniq[int(np.argmax(counts))]
                    other = np.flatnonzero(values != first)
                odd = values[other].tolist()
                if absent is None:
                    base[name] = first.item()
                else:
                    base[name] = None if first == absent else first.item()
                    odd = [None if v == absent else v for v in odd]
                exceptions.append((name, other.tolist(), odd))
        templates = {}
        for code in set(self.job_codes):
            t = templates[code] = base.copy()
            t["job_id"], t["user"], t["partition"], t["account"] = metas[code]
        windows: list[dict[str, Any]] = []
        # w[name] = v for each window, the loop in C; a chunk of windows at a time, so the
        # dicts being filled stay in the processor's cache from one field to the next
        for lo in range(0, n, _DICT_CHUNK):
            chunk = [templates[c].copy() for c in self.job_codes[lo : lo + _DICT_CHUNK]]
            m = len(chunk)
            for name, column in listed:
                deque(map(setitem, chunk, repeat(name, m), column[lo : lo + m]), 0)
            windows += chunk
        for name, rows, odd in exceptions:
            for i, v in zip(rows, odd, strict=True):
                windows[i][name] = v
        return windows


class LazyWindows(Sequence[dict[str, Any]]):
    """One job's GpuWindow dicts (``slots`` of ``dicts``, in order), made on first access: one
    by index, all on first iteration (a dict made before is kept: the same object either way)."""

    def __init__(self, dicts: WindowDicts, slots: list[int]) -> None:
        self._dicts = dicts
        self._slots = slots
        self._made: dict[int, dict[str, Any]] = {}
        self._all: list[dict[str, Any]] | None = None

    def __len__(self) -> int:
        return len(self._slots)

    @overload
    def __getitem__(self, i: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, i: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, i: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if self._all is not None:
            return self._all[i]
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        k = i + len(self) if i < 0 else i
        if not 0 <= k < len(self):
            raise IndexError(i)
        w = self._made.get(k)
        if w is None:
            w = self._made[k] = self._dicts.one(self._slots[k])
        return w

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.materialized())

    @property
    def untouched(self) -> bool:
        """Whether no caller could have changed a window: none was iterated (a dict made by
        index is read only where a finding is made)."""
        return self._all is None

    def closed(self) -> ClosedWindows:
        """These windows as columns of their own, in this order (see
        :meth:`~peerwatch.streams.core.windows.ClosedWindows.subset`); only while
        :attr:`untouched`."""
        return self._dicts.closed.subset(np.asarray(self._slots, np.int64))

    def scored_messages(
        self, header: bytes, scores: Sequence[float | None], gates: Sequence[str | None]
    ) -> list[bytes] | None:
        """Every window's GpuWindow message (``header`` + Avro), in order, with its ``score``
        and ``gated`` (one each, in order), made from the columns (:meth:`WindowDicts.encoded`);
        None when a window may have been changed (not :attr:`untouched`) or a value does not
        fit the schema (encode the dicts then: their encoder raises EncodeError naming the
        field)."""
        if not self.untouched:
            return None
        dicts, slots = self._dicts, self._slots
        given: dict[str, list[Any]] = {"score": [None] * dicts.n, "gated": [None] * dicts.n}
        for slot, score, gated in zip(slots, scores, gates, strict=True):
            given["score"][slot] = score
            given["gated"][slot] = gated
        try:
            every = dicts.encoded(header, given)
        except (ValueError, TypeError, OverflowError, KeyError, AttributeError):  # Unfit, or
            return None  # a value a field encoder refuses: the dicts' encoder names it
        return [every[s] for s in slots]

    def materialized(self) -> list[dict[str, Any]]:
        """Every window as a dict (made now if not yet), in order."""
        if self._all is None:
            every, made = self._dicts.every(), self._made
            self._all = [made.get(k) or every[s] for k, s in enumerate(self._slots)]
        return self._all
