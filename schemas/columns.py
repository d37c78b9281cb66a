"""Records as columns: the fields a consumer selects, flattened into numpy arrays.

A :class:`TableSpec` is built from a wire schema and a *selection* (which fields, nested arrays of
records included); decoding a batch of records with it gives one :class:`Table` per record
level: the top level (one row per record) and one per selected array of records (one row per
item, with ``parent``, the row of the record it belongs to). A selected field becomes one array:

* ``int``: long, int, boolean (0/1) and enum (the symbol's index), as int64;
* ``float``: float and double, as float64;
* ``str``: strings as int64 codes into a caller-owned ``dict[str, int]`` (a code is the
  string's insertion position, so a dict kept across batches gives stable codes). The dict only
  ever grows: nothing but the decoders adds to it, nothing removes from it (the C decoder caches
  codes across calls on that promise).

A field whose type is a union with null also has a ``valid`` array (False: null, the value is 0).
Fields not selected are stepped over. Two back ends fill the same tables from the same spec:
:func:`tables_from_records` here from decoded dicts (the generated Python reader's output, or the
simulator's records), and the C module's ``decode_columns`` (:mod:`peerwatch.schemas.native`)
straight from Avro bytes; they are tested equal, value for value and refusal for refusal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from peerwatch.schemas.compiled import Unsupported

INT, FLOAT, STR = "int", "float", "str"
_KINDS = {
    "long": INT, "int": INT, "boolean": INT, "float": FLOAT, "double": FLOAT, "string": STR,
}  # fmt: skip

#: Slots of the C decoder's string cache (72 bytes each, zeroed pages, touched as used): room
#: for the node names and GPU UUIDs of a 100,000-GPU fleet with few collisions.
STRING_CACHE_SLOTS = 131072

Int64s = npt.NDArray[np.int64]
Float64s = npt.NDArray[np.float64]
Bools = npt.NDArray[np.bool_]
#: One table as the C module's ``decode_columns`` gives it: its rows, the parent row of each
#: (int64 bytes), each selected column's values (int64 or float64 bytes, in the spec's order)
#: and the null flags (one byte per row and column, row by row). Views of bytes serve too.
Buffer = bytes | memoryview
RawTable = tuple[int, Buffer, list[Buffer], Buffer]


@dataclass(frozen=True)
class ColumnSpec:
    """One selected field: its name, kind (int, float, str), whether null is allowed, and the
    enum symbols when it is an enum (an int column of symbol indices)."""

    name: str
    kind: str
    nullable: bool
    symbols: tuple[str, ...] | None = None


@dataclass(frozen=True)
class TableSpec:
    """The selected fields of one record level and its selected arrays of records."""

    path: str
    columns: tuple[ColumnSpec, ...]
    children: tuple[tuple[str, TableSpec], ...] = ()

    def tables(self) -> list[TableSpec]:
        """This spec and its descendants, depth first (the order of :class:`Table` outputs)."""
        out = [self]
        for _, child in self.children:
            out += child.tables()
        return out


@dataclass
class Table:
    """The rows of one record level: ``values[name]`` arrays of ``n`` rows, ``valid[name]`` for
    nullable fields, ``parent`` (row of the enclosing level) for nested levels."""

    n: int
    values: dict[str, Any]
    valid: dict[str, Bools] = field(default_factory=dict)
    parent: Int64s | None = None


def _branch(t: Any) -> tuple[Any, bool]:
    """``(type, nullable)``: a two-branch union with null unwrapped."""
    if isinstance(t, list):
        rest = [b for b in t if b != "null"]
        if len(rest) == 1 and len(t) == 2:
            return rest[0], True
        raise Unsupported(f"union {t!r} is not [null, X]")
    return t, False


def _type_name(t: Any) -> str:
    return str(t.get("type")) if isinstance(t, dict) else str(t)


def table_spec(schema: Any, selection: Mapping[str, Any], path: str = "") -> TableSpec:
    """The spec of ``selection`` over a record ``schema`` (a wire schema: no named-type
    references inside the selected fields). ``selection`` maps field names to True (the field as
    its own kind) or, for an array of records, to a nested selection. Fields missing from the
    schema are left out (their consumer sees no column); a field of another shape raises
    :class:`Unsupported`."""
    fields = {f["name"]: f["type"] for f in schema["fields"]}
    columns: list[ColumnSpec] = []
    children: list[tuple[str, TableSpec]] = []
    for name, sub in selection.items():
        if name not in fields:
            continue
        t, nullable = _branch(fields[name])
        kind = _type_name(t)
        if isinstance(sub, Mapping):
            items = t.get("items") if isinstance(t, dict) and kind == "array" else None
            if nullable or not isinstance(items, dict) or items.get("type") != "record":
                raise Unsupported(f"{path}{name} is not an array of records")
            children.append((name, table_spec(items, sub, f"{path}{name}.")))
        elif kind == "enum":
            columns.append(ColumnSpec(name, INT, nullable, tuple(t["symbols"])))
        elif kind in _KINDS:
            columns.append(ColumnSpec(name, _KINDS[kind], nullable))
        else:
            raise Unsupported(f"{path}{name}: {kind} cannot be a column")
    return TableSpec(path, tuple(columns), tuple(children))


def _fill(spec: TableSpec, rows: Sequence[Mapping[str, Any]], strings: dict[str, int],
          out: dict[str, Table], parent: Int64s | None) -> None:  # fmt: skip
    n = len(rows)
    table = Table(n, {}, {}, parent)
    out[spec.path] = table
    for col in spec.columns:
        raw = [r.get(col.name) for r in rows]
        if col.nullable:
            valid = np.fromiter((v is not None for v in raw), np.bool_, n)
            table.valid[col.name] = valid
        elif any(v is None for v in raw):
            raise ValueError(f"{spec.path}{col.name}: null in a field that allows none")
        if col.symbols is not None:
            index = {s: i for i, s in enumerate(col.symbols)}
            table.values[col.name] = np.fromiter(
                (0 if v is None else index[v] for v in raw), np.int64, n
            )
        elif col.kind == STR:
            table.values[col.name] = np.fromiter(
                (0 if v is None else strings.setdefault(v, len(strings)) for v in raw),
                np.int64,
                n,
            )
        elif col.kind == FLOAT:
            table.values[col.name] = np.fromiter(
                (0.0 if v is None else v for v in raw), np.float64, n
            )
        else:
            table.values[col.name] = np.fromiter((0 if v is None else v for v in raw), np.int64, n)
    for name, child in spec.children:
        lists = [r.get(name) or () for r in rows]
        lengths = np.fromiter((len(x) for x in lists), np.int64, n)
        child_parent = np.repeat(np.arange(n, dtype=np.int64), lengths)
        _fill(child, [item for x in lists for item in x], strings, out, child_parent)


def tables_from_records(
    spec: TableSpec, records: Sequence[Mapping[str, Any]], strings: dict[str, int]
) -> dict[str, Table]:
    """The tables of decoded ``records`` (dicts as the codec or the simulator gives them), keyed
    by path (``""`` for the top level, ``"gpus."`` for the items of ``gpus``...). Raises
    ValueError for a null in a non-nullable field, KeyError for an unknown enum symbol,
    OverflowError for an int beyond int64."""
    out: dict[str, Table] = {}
    _fill(spec, records, strings, out, None)
    return out


class ColumnDecoder:
    """Avro bodies of one writer schema straight into the :class:`Table` s of ``spec``, through
    the C module (see ``decode_columns`` in ``_avro_native.c``). The C and the Python back ends
    (:func:`tables_from_records`) are tested equal. Raises :class:`Unsupported` when the C
    module is not in use or the schema does not fit the spec."""

    def __init__(self, spec: TableSpec, wire_schema: Any, module: Any = None) -> None:
        """``module``: the C module to use (default: the one in use; the fuzzer passes its
        sanitizer build)."""
        from peerwatch.schemas import native

        module = module if module is not None else native.native
        if module is None:
            raise Unsupported("the C module is not in use")
        self._decode = module.decode_columns
        self._string_cache = module.string_cache
        self.spec = spec
        self._tables = spec.tables()
        self._program, self._ncols = native.column_program(spec, wire_schema)
        self._cache: Any = None  # the C string cache of the last ``strings`` dict given
        #: rows expected per table in the next call: the C module allocates its columns for
        #: that many at once (it grows them past it if needed; None: from 64 rows, doubling)
        self._hints: tuple[int, ...] | None = None

    def _cache_of(self, strings: dict[str, int]) -> Any:
        """The C module's cache of string codes for ``strings``, kept across calls (a node's
        name and its GPUs' UUIDs recur in every batch). Valid because ``strings`` only grows:
        the codes are insertion positions (see the module docstring)."""
        cache = self._cache
        if cache is None or cache[0] is not strings:
            cache = self._cache = (strings, self._string_cache(strings, STRING_CACHE_SLOTS))
        return cache[1]

    def messages(
        self, bodies: Sequence[Any], offset: int, strings: dict[str, int]
    ) -> tuple[dict[str, Table], list[tuple[int, str]]]:
        """One record per buffer, at ``offset`` and ending the buffer (Kafka message values).
        Returns the tables and ``(position in bodies, reason)`` of each record not read."""
        raw, bad, _ = self._decode(self._program, self._ncols, bodies, offset, 0, strings,
                                   self._cache_of(strings), self._hints)  # fmt: skip
        self._next_hints(raw)
        return self.wrap(raw), bad

    def block(
        self, data: Any, offset: int, count: int, strings: dict[str, int]
    ) -> tuple[dict[str, Table], list[tuple[int, str]], int]:
        """``count`` records one after the other from ``offset`` (an archive block). Returns the
        tables, ``(record number, reason)`` of each record not read (a record with invalid
        UTF-8, a boolean byte above 1 or a long over 64 bits is skipped and the next read; any
        other fault ends the block there: the last entry) and the offset after the last record
        read."""
        raw, bad, end = self.block_raw(data, offset, count, strings)
        return self.wrap(raw), bad, end

    def block_raw(
        self, data: Any, offset: int, count: int, strings: dict[str, int]
    ) -> tuple[list[RawTable], list[tuple[int, str]], int]:
        """As :meth:`block`, the tables as the C module gives them (:data:`RawTable`: plain
        bytes, which a process can pass to another; :meth:`wrap` makes them tables)."""
        raw, bad, end = self._decode(self._program, self._ncols, data, offset, count, strings,
                                     self._cache_of(strings), self._hints)  # fmt: skip
        self._next_hints(raw)
        return raw, bad, end

    def _next_hints(self, raw: Sequence[RawTable]) -> None:
        # the next call's first capacities: this call's rows and an eighth more (archive blocks
        # and Kafka batches of one stream are about the same size each time)
        self._hints = tuple(r[0] + r[0] // 8 + 64 for r in raw)

    def wrap(self, raw: Sequence[RawTable]) -> dict[str, Table]:
        """The tables of the C module's output (arrays over its bytes, no copy)."""
        out: dict[str, Table] = {}
        for spec, (rows, parent, values, valid) in zip(self._tables, raw, strict=True):
            table = Table(rows, {}, {}, None if not spec.path else np.frombuffer(parent, np.int64))
            # the C module writes a row's flags together (one byte per column, row by row):
            # one transposing copy gives each nullable column its own contiguous flags
            flags = None
            if any(col.nullable for col in spec.columns):
                flags = np.frombuffer(valid, np.bool_).reshape(rows, len(spec.columns)).T.copy()
                flags.flags.writeable = False  # as the value columns (views of bytes)
            for i, (col, v) in enumerate(zip(spec.columns, values, strict=True)):
                table.values[col.name] = np.frombuffer(
                    v, np.float64 if col.kind == FLOAT else np.int64
                )
                if flags is not None and col.nullable:
                    table.valid[col.name] = flags[i]
            out[spec.path] = table
        return out


def select_rows(tables: Mapping[str, Table], keep: Bools) -> dict[str, Table]:
    """The tables of the records where ``keep`` (one flag per top-level row) is True: nested
    rows follow their record, parents renumbered. Only one level of nesting below the top (the
    shape of every selection here) is supported."""
    out: dict[str, Table] = {}
    new_row = np.cumsum(keep) - 1
    for path, t in tables.items():
        if t.parent is None:
            mask = keep
            parent = None
        else:
            mask = keep[t.parent] if t.n else np.zeros(0, np.bool_)
            parent = new_row[t.parent[mask]]
        out[path] = Table(
            int(mask.sum()),
            {k: v[mask] for k, v in t.values.items()},
            {k: v[mask] for k, v in t.valid.items()},
            parent,
        )
    return out


class MessageColumns:
    """Single-object-encoded messages of one schema (Kafka message values) as the tables of
    ``spec``: through the C module for the current schema version, through the codec's decoded
    dicts for released versions (or everything, without the C module). Same tables either way;
    string codes come from the caller's ``strings``."""

    def __init__(self, schema_name: str, spec: TableSpec) -> None:
        from peerwatch.schemas.codec import HEADER_LEN, codec_for
        from peerwatch.schemas.registry import raw_schema, strip_logical_types

        self.spec = spec
        self.codec = codec_for(schema_name)
        self._header_len = HEADER_LEN
        self._c: ColumnDecoder | None
        try:
            self._c = ColumnDecoder(spec, strip_logical_types(raw_schema(schema_name)))
        except Unsupported:
            self._c = None

    def decode(
        self, values: Sequence[bytes], strings: dict[str, int]
    ) -> tuple[dict[str, Table], Int64s, list[tuple[int, str]]]:
        """``(tables, message of each top-level row, [(message index, reason)] not decoded)``;
        rows keep the messages' order."""
        from peerwatch.errors import CodecError

        if self._c is not None and all(self.codec.current_body(v) is not None for v in values):
            tables, bad = self._c.messages(values, self._header_len, strings)
        else:
            records: list[Mapping[str, Any]] = []
            bad = []
            for i, v in enumerate(values):
                try:
                    records.append(self.codec.decode(v))
                except CodecError as exc:
                    bad.append((i, str(exc)))
            tables = tables_from_records(self.spec, records, strings)
        refused = {i for i, _ in bad}
        rows = np.fromiter((i for i in range(len(values)) if i not in refused), np.int64)
        return tables, rows, bad


def concat_tables(parts: Sequence[Mapping[str, Table]]) -> dict[str, Table]:
    """Tables of several batches one after the other (parents renumbered); one nesting level."""
    if len(parts) == 1:
        return dict(parts[0])
    out: dict[str, Table] = {}
    tops = [p[""].n for p in parts]
    offsets = np.concatenate([[0], np.cumsum(tops)[:-1]]).astype(np.int64)
    for path, first in parts[0].items():
        tables = [p[path] for p in parts]
        parent = None
        if first.parent is not None:
            parent = np.concatenate(
                [
                    t.parent + off
                    for t, off in zip(tables, offsets, strict=True)
                    if t.parent is not None
                ]
            )
        out[path] = Table(
            sum(t.n for t in tables),
            {k: _read_only(np.concatenate([t.values[k] for t in tables])) for k in first.values},
            {k: _read_only(np.concatenate([t.valid[k] for t in tables])) for k in first.valid},
            parent,
        )
    return out


def _read_only(a: np.ndarray) -> np.ndarray:
    """``a``, no longer writeable: column values are read-only wherever they come from, as the
    C decoder's are (the loops then take them as they are, without a read-only view each)."""
    a.flags.writeable = False
    return a


def take_rows(tables: Mapping[str, Table], order: Int64s) -> dict[str, Table]:
    """The records ``order`` (top-level row numbers, each at most once) in that order, nested
    rows following their record; one nesting level."""
    out: dict[str, Table] = {}
    top_n = next(t.n for t in tables.values() if t.parent is None)
    for path, t in tables.items():
        if t.parent is None:
            rows = order
            parent = None
        else:
            counts = np.bincount(t.parent, minlength=top_n) if t.n else np.zeros(top_n, np.int64)
            starts = np.cumsum(counts) - counts
            took = counts[order]
            new_starts = np.cumsum(took) - took
            rows = np.repeat(starts[order] - new_starts, took) + np.arange(int(took.sum()))
            parent = np.repeat(np.arange(len(order), dtype=np.int64), took)
        out[path] = Table(
            len(rows),
            {k: v[rows] for k, v in t.values.items()},
            {k: v[rows] for k, v in t.valid.items()},
            parent,
        )
    return out


def slice_rows(tables: Mapping[str, Table], lo: int, hi: int) -> dict[str, Table]:
    """Top-level rows ``[lo, hi)`` and their nested rows, as views (nested rows must be in
    record order, as every decoder and :func:`take_rows` leave them); one nesting level."""
    out: dict[str, Table] = {}
    for path, t in tables.items():
        if t.parent is None:
            a, b, parent = lo, hi, None
        else:
            a, b = (int(x) for x in np.searchsorted(t.parent, [lo, hi], side="left"))
            parent = t.parent[a:b] - lo
        out[path] = Table(
            b - a,
            {k: v[a:b] for k, v in t.values.items()},
            {k: v[a:b] for k, v in t.valid.items()},
            parent,
        )
    return out
