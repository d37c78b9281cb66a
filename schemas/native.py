"""The optional C decoder (``_avro_native.c``): plans built from schemas, and whether it is on.

The C module walks a *plan*, nested ``(kind, a, b)`` tuples made here from a wire schema, and
builds the very objects the generated Python reader of :mod:`peerwatch.schemas.compiled` builds
(tested equal on random records and on corrupted bytes). On an 8-GPU NodeGpuSample it decodes
about ten times faster than that reader (``scripts/bench_codec.py``), which is what lets one
stream worker keep up with 50,000 GPU readings per second.

The module is built by ``pip install`` (a C compiler and the Python headers are needed; the
build is optional). Without it, or with ``PEERWATCH_NATIVE=0`` in the environment, the codec
uses the generated Python reader: same results, slower.
"""

from __future__ import annotations

import functools
import importlib
import os
from typing import Any

from peerwatch.schemas.compiled import Unsupported

Plan = tuple[int, Any, Any]

NULL, BOOL, LONG, FLOAT, DOUBLE, STRING, BYTES, ENUM, ARRAY, MAP, UNION, RECORD = range(12)
_PRIMITIVE_KINDS = {
    "null": NULL, "boolean": BOOL, "int": LONG, "long": LONG, "float": FLOAT,
    "double": DOUBLE, "string": STRING, "bytes": BYTES,
}  # fmt: skip


def load_native(module: str) -> Any:
    """The C extension ``module``, or None when it is not built or ``PEERWATCH_NATIVE=0`` (or
    false, no, off) turns the C modules off."""
    if os.environ.get("PEERWATCH_NATIVE", "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


#: The C module, or None (not built, or turned off with ``PEERWATCH_NATIVE=0``).
native: Any = load_native("peerwatch.schemas._avro_native")


def available() -> bool:
    """Whether decoding goes through the C module in this process."""
    return native is not None


def plan_of(schema: Any) -> Plan:
    """The plan of a wire schema (no logical types; as :func:`registry.strip_logical_types`
    gives). Raises :class:`Unsupported` for a reference to an unknown named type."""
    named: dict[str, Plan] = {}

    def walk(t: Any, ns: str | None) -> Plan:
        if isinstance(t, list):
            return (UNION, tuple(walk(b, ns) for b in t), None)
        if isinstance(t, str):
            if t in _PRIMITIVE_KINDS:
                return (_PRIMITIVE_KINDS[t], None, None)
            full = t if "." in t or not ns else f"{ns}.{t}"
            for key in (full, t):
                if key in named:
                    return named[key]
            raise Unsupported(f"unknown named type {t!r}")
        if not isinstance(t, dict):
            raise Unsupported(f"schema node {t!r}")
        kind = t.get("type")
        if kind in _PRIMITIVE_KINDS:
            return (_PRIMITIVE_KINDS[kind], None, None)
        name = t.get("name")
        inner_ns = t.get("namespace", ns)
        full_name = None
        if name:
            full_name = name if "." in name or not inner_ns else f"{inner_ns}.{name}"
            inner_ns = full_name.rpartition(".")[0] or inner_ns
        if kind == "record":
            # Recursive records are not used by our schemas; a self-reference is unsupported.
            fields = t["fields"]
            plan: Plan = (
                RECORD,
                tuple(str(f["name"]) for f in fields),
                tuple(walk(f["type"], inner_ns) for f in fields),
            )
        elif kind == "enum":
            plan = (ENUM, tuple(str(s) for s in t["symbols"]), None)
        elif kind == "array":
            plan = (ARRAY, walk(t["items"], ns), None)
        elif kind == "map":
            plan = (MAP, walk(t["values"], ns), None)
        else:
            raise Unsupported(f"type {kind!r}")
        if full_name:
            named[full_name] = plan
            named[full_name.rsplit(".", 1)[-1]] = plan
        return plan

    return walk(schema, None)


def native_decoder(schema: Any) -> Any:
    """``(buffer, offset) -> (record, end)`` through the C module for ``schema``, or None when
    the module is not in use. Raises ValueError/UnicodeDecodeError on malformed bytes."""
    if native is None:
        return None
    return functools.partial(native.decode, plan_of(schema))


def native_skipper(schema: Any) -> Any:
    """``(buffer, offset) -> end`` stepping over one value of ``schema`` without building it
    (refusing what decoding refuses, invalid UTF-8 included), or None when the C module is not
    in use."""
    if native is None:
        return None
    return functools.partial(native.skip, plan_of(schema))


def native_lenient_skipper(schema: Any) -> Any:
    """``(buffer, offset) -> end`` of one value of ``schema`` that steps over the value faults
    whose extent is known (invalid UTF-8, a boolean byte above 1, a long over 64 bits), as
    ``decode_columns`` does in a block; or None when the C module is not in use. Raises
    ValueError where the value's end is not known."""
    if native is None:
        return None
    return functools.partial(native.skip_lenient, plan_of(schema))


OP_SKIP, OP_VALUE, OP_TABLE = range(3)


def column_program(spec: Any, wire_schema: Any) -> tuple[tuple[Any, ...], tuple[int, ...]]:
    """The C module's column program for a :class:`~peerwatch.schemas.columns.TableSpec` over a
    record wire schema (as :func:`plan_of` takes it): ``(ops, ncols)``, one op per field of each
    record level in schema order, and the column count of each table (depth first, as
    ``spec.tables()``). Raises :class:`Unsupported` where a selected field has another shape."""
    tables = spec.tables()
    number = {id(t): i for i, t in enumerate(tables)}

    def level(t: Any, plan: Plan) -> tuple[Any, ...]:
        if plan[0] != RECORD:
            raise Unsupported(f"{t.path or 'the record'} is not a record")
        columns = {c.name: i for i, c in enumerate(t.columns)}
        children = dict(t.children)
        ops: list[tuple[Any, ...]] = []
        for name, sub in zip(plan[1], plan[2], strict=True):
            if name in children:
                child = children[name]
                if sub[0] != ARRAY:
                    raise Unsupported(f"{t.path}{name} is not an array")
                ops.append((OP_TABLE, number[id(child)], 0, level(child, sub[1])))
            elif name in columns:
                value = sub
                if sub[0] == UNION:  # the C module finds the null branch itself
                    kinds = [b[0] for b in sub[1]]
                    if len(kinds) != 2 or NULL not in kinds:
                        raise Unsupported(f"{t.path}{name}: union {kinds} is not [null, X]")
                    value = sub[1][1 - kinds.index(NULL)]
                if value[0] not in (LONG, BOOL, ENUM, FLOAT, DOUBLE, STRING):
                    raise Unsupported(f"{t.path}{name} is not a column")
                ops.append((OP_VALUE, columns[name], 0, sub))
            else:
                ops.append((OP_SKIP, 0, 0, sub))
        return tuple(ops)

    return level(tables[0], plan_of(wire_schema)), tuple(len(t.columns) for t in tables)
