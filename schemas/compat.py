"""Avro schema-resolution compatibility: can data written with one schema be read with another?

A pure checker of the rules in the Avro specification ("Schema Resolution"): records match by
unqualified name or a reader alias, reader fields missing from the writer need a default,
numeric promotions int -> long -> float -> double, string <-> bytes, unions on either side,
enum symbols (unless the reader enum has a default), arrays and maps recursively, fixed sizes.
Accepts raw JSON schemas or fastavro-parsed ones.

As in the specification, some verdicts hold only for well-behaved data: bytes read as string
must be UTF-8.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
NAMED_KINDS = frozenset({"record", "error", "enum", "fixed"})
_PROMOTIONS: dict[str, frozenset[str]] = {
    "int": frozenset({"long", "float", "double"}),
    "long": frozenset({"float", "double"}),
    "float": frozenset({"double"}),
    "string": frozenset({"bytes"}),
    "bytes": frozenset({"string"}),
}


def _fullname(name: str, namespace: str) -> str:
    if "." in name or not namespace:
        return name
    return f"{namespace}.{name}"


def _space_of(fullname: str) -> str:
    return fullname.rpartition(".")[0]


@dataclass(frozen=True)
class _Node:
    """A schema node with named references resolved: ``kind`` is a primitive or complex kind."""

    kind: str
    schema: Any
    namespace: str
    fullname: str = ""


@dataclass
class _Side:
    """Named types of one schema, by full name."""

    named: dict[str, tuple[dict[str, Any], str]] = field(default_factory=dict)

    def collect(self, schema: Any, namespace: str) -> None:
        if isinstance(schema, list):
            for branch in schema:
                self.collect(branch, namespace)
            return
        if not isinstance(schema, dict):
            return
        kind = schema.get("type")
        if isinstance(kind, (dict, list)):
            self.collect(kind, namespace)
            return
        if kind in NAMED_KINDS:
            full = _fullname(str(schema["name"]), str(schema.get("namespace", namespace)))
            self.named.setdefault(full, (schema, _space_of(full)))
            if kind in ("record", "error"):
                for fld in schema.get("fields", []):
                    self.collect(fld.get("type"), _space_of(full))
        elif kind == "array":
            self.collect(schema.get("items"), namespace)
        elif kind == "map":
            self.collect(schema.get("values"), namespace)

    def node(self, schema: Any, namespace: str) -> _Node:
        if isinstance(schema, list):
            return _Node("union", schema, namespace)
        if isinstance(schema, dict):
            kind = schema.get("type")
            if isinstance(kind, (dict, list)):
                return self.node(kind, namespace)
            if kind in NAMED_KINDS:
                full = _fullname(str(schema["name"]), str(schema.get("namespace", namespace)))
                return _Node(str(kind), schema, _space_of(full), full)
            if kind in ("array", "map"):
                return _Node(str(kind), schema, namespace)
            return self.node(kind, namespace)  # {"type": "long", ...} or {"type": "SomeName"}
        if isinstance(schema, str):
            if schema in PRIMITIVES:
                return _Node(schema, schema, namespace)
            for candidate in (_fullname(schema, namespace), schema):
                if candidate in self.named:
                    definition, space = self.named[candidate]
                    return _Node(str(definition["type"]), definition, space, candidate)
            return _Node("unresolved", schema, namespace, schema)
        return _Node("unresolved", repr(schema), namespace)


def _describe(node: _Node) -> str:
    return node.fullname or node.kind


def _names_match(reader: _Node, writer: _Node) -> bool:
    r_short = reader.fullname.rpartition(".")[2]
    w_short = writer.fullname.rpartition(".")[2]
    if r_short == w_short:
        return True
    aliases = {_fullname(str(a), reader.namespace) for a in reader.schema.get("aliases", [])}
    aliases |= {str(a) for a in reader.schema.get("aliases", [])}
    return writer.fullname in aliases or w_short in aliases


def _shallow_match(reader: _Node, writer: _Node, *, exact: bool) -> bool:
    """Whether the resolver would pick ``reader`` (a union branch) for ``writer``."""
    if reader.kind in PRIMITIVES and writer.kind in PRIMITIVES:
        if reader.kind == writer.kind:
            return True
        return not exact and reader.kind in _PROMOTIONS.get(writer.kind, frozenset())
    if reader.kind != writer.kind:
        return False
    if reader.kind in NAMED_KINDS:
        return _names_match(reader, writer)
    return reader.kind in ("array", "map")


class _Checker:
    def __init__(self, reader: Any, writer: Any) -> None:
        self.reader_side = _Side()
        self.reader_side.collect(reader, "")
        self.writer_side = _Side()
        self.writer_side.collect(writer, "")
        self.errors: list[str] = []
        self._in_progress: set[tuple[str, str]] = set()

    def check(self, r: _Node, w: _Node, path: str) -> None:
        for node, side in ((r, "reader"), (w, "writer")):
            if node.kind == "unresolved":
                self.errors.append(f"{path}: {side} type {node.schema!r} is not defined")
                return
        if w.kind == "union":
            for branch in w.schema:
                wb = self.writer_side.node(branch, w.namespace)
                self.check(r, wb, f"{path}<{_describe(wb)}>")
            return
        if r.kind == "union":
            branches = [self.reader_side.node(b, r.namespace) for b in r.schema]
            chosen = next((b for b in branches if _shallow_match(b, w, exact=True)), None)
            if chosen is None:
                chosen = next((b for b in branches if _shallow_match(b, w, exact=False)), None)
            if chosen is None:
                names = ", ".join(_describe(b) for b in branches)
                self.errors.append(
                    f"{path}: no branch of reader union [{names}] reads {_describe(w)}"
                )
                return
            self.check(chosen, w, path)
            return
        if r.kind in PRIMITIVES and w.kind in PRIMITIVES:
            if r.kind != w.kind and r.kind not in _PROMOTIONS.get(w.kind, frozenset()):
                self.errors.append(f"{path}: reader type {r.kind} cannot read writer type {w.kind}")
            return
        if r.kind != w.kind:
            self.errors.append(f"{path}: reader {_describe(r)} cannot read writer {_describe(w)}")
            return
        if r.kind in NAMED_KINDS and not _names_match(r, w):
            self.errors.append(f"{path}: reader {r.kind} {r.fullname} does not match {w.fullname}")
            return
        if r.kind in ("record", "error"):
            self._check_record(r, w, path)
        elif r.kind == "enum":
            self._check_enum(r, w, path)
        elif r.kind == "fixed":
            if r.schema.get("size") != w.schema.get("size"):
                sizes = f"{r.schema.get('size')} vs writer {w.schema.get('size')}"
                self.errors.append(f"{path}: fixed {r.fullname} size {sizes}")
        elif r.kind == "array":
            self.check(self._child(r, "items"), self._child(w, "items", writer=True), f"{path}[]")
        elif r.kind == "map":
            self.check(
                self._child(r, "values"), self._child(w, "values", writer=True), f"{path}{{}}"
            )

    def _child(self, node: _Node, key: str, *, writer: bool = False) -> _Node:
        side = self.writer_side if writer else self.reader_side
        return side.node(node.schema.get(key), node.namespace)

    def _check_record(self, r: _Node, w: _Node, path: str) -> None:
        key = (r.fullname, w.fullname)
        if key in self._in_progress:  # recursive type: assume the cycle holds
            return
        self._in_progress.add(key)
        writer_fields = {str(f["name"]): f for f in w.schema.get("fields", [])}
        for rf in r.schema.get("fields", []):
            name = str(rf["name"])
            wf = writer_fields.get(name)
            if wf is None:
                wf = next(
                    (writer_fields[a] for a in rf.get("aliases", []) if a in writer_fields), None
                )
            field_path = f"{path}.{name}"
            rnode = self.reader_side.node(rf.get("type"), r.namespace)
            if wf is None:
                if "default" not in rf:
                    self.errors.append(f"{field_path}: not in the writer and has no default")
                elif not _default_fits(rf["default"], rnode, self.reader_side):
                    self.errors.append(f"{field_path}: default {rf['default']!r} does not fit")
                continue
            self.check(rnode, self.writer_side.node(wf.get("type"), w.namespace), field_path)
        self._in_progress.discard(key)

    def _check_enum(self, r: _Node, w: _Node, path: str) -> None:
        reader_symbols = list(r.schema.get("symbols", []))
        default = r.schema.get("default")
        if default is not None and default not in reader_symbols:
            self.errors.append(f"{path}: enum {r.fullname} default {default!r} is not a symbol")
            return
        missing = [s for s in w.schema.get("symbols", []) if s not in reader_symbols]
        if missing and default is None:
            self.errors.append(f"{path}: enum {r.fullname} lacks writer symbols {missing}")


def _default_fits(value: Any, node: _Node, side: _Side) -> bool:
    """Whether ``value`` is a valid JSON default for ``node`` (unions: their first branch)."""
    kind = node.kind
    if kind == "union":
        return bool(node.schema) and _default_fits(
            value, side.node(node.schema[0], node.namespace), side
        )
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if kind in ("int", "long"):
        return isinstance(value, int) and not isinstance(value, bool)
    if kind in ("float", "double"):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind in ("string", "bytes"):
        return isinstance(value, str)
    if kind == "fixed":
        return isinstance(value, str) and len(value) == node.schema.get("size")
    if kind == "enum":
        return value in node.schema.get("symbols", [])
    if kind == "array":
        items = side.node(node.schema.get("items"), node.namespace)
        return isinstance(value, list) and all(_default_fits(v, items, side) for v in value)
    if kind == "map":
        values = side.node(node.schema.get("values"), node.namespace)
        return isinstance(value, dict) and all(
            _default_fits(v, values, side) for v in value.values()
        )
    if kind in ("record", "error"):
        if not isinstance(value, dict):
            return False
        for fld in node.schema.get("fields", []):
            fnode = side.node(fld.get("type"), node.namespace)
            if fld["name"] in value:
                if not _default_fits(value[fld["name"]], fnode, side):
                    return False
            elif "default" not in fld:
                return False
        return True
    return False


def check_compatible(reader: Any, writer: Any) -> list[str]:
    """Problems that stop ``reader`` from reading data written with ``writer``; empty = readable.

    Both are Avro schemas as JSON (dict, list or type name) or as parsed by fastavro. Each
    problem is one line starting with the path of the field concerned. Never raises for a
    well-formed schema; an undefined named type is reported as a problem.
    """
    checker = _Checker(reader, writer)
    r = checker.reader_side.node(reader, "")
    w = checker.writer_side.node(writer, "")
    checker.check(r, w, _describe(r) if r.fullname else "<root>")
    return checker.errors


def check_full(current: Any, released: Any) -> list[str]:
    """Full compatibility: ``current`` reads ``released`` data and ``released`` reads current.

    Problems are prefixed with ``backward:`` (current cannot read released) or ``forward:``.
    """
    return [f"backward: {p}" for p in check_compatible(current, released)] + [
        f"forward: {p}" for p in check_compatible(released, current)
    ]
